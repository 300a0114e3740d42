"""The dynamic half: which inventoried reads differed across ranks in a real-engine run, and
whether the decision each feeds was taken there (docs/sources.md, "Dynamic").

Reads the `sources` field of each rank's step lines (evidence/probes.py says what
the plugin records). Steps are compared by number: step N is the same micro-batch slot on every
PP stage (engines/sglang/plugin/recorder.py). A rank with no line at a step it went past was idle
there; a step where a probed decision acted always has a line, so an idle rank's decision did
nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from hicache_diag import evidence as ev
from hicache_diag.errors import RunDirError
from hicache_diag.evidence.probes import BY_NAME
from hicache_diag.sources.model import Inventory

RUN_SCHEMA = "hicache-diag/sources-run/v1"


@dataclass(frozen=True, slots=True)
class StepView:
    """One step of one source: per rank what it read (None: no read recorded) and what the
    decision did ([]: nothing)."""

    step: int
    values: dict[int, list | None]
    outcomes: dict[int, list]

    @property
    def decided(self) -> bool:
        return any(self.outcomes.values())

    def to_json(self) -> dict:
        return {
            "step": self.step,
            "decided": self.decided,
            "values": {str(r): v for r, v in self.values.items()},
            "outcomes": {str(r): d for r, d in self.outcomes.items()},
        }


@dataclass(frozen=True, slots=True)
class SourceRun:
    """One probed source over a run."""

    name: str
    kind: str
    classic: str | None
    decision: str
    reads: str  # where SGLang reads it
    ranks_read: tuple[int, ...]  # ranks that recorded at least one read
    steps_read: int  # steps where some rank read it
    steps_compared: int  # steps where two ranks or more read it
    steps_differed: int  # of those, the ranks' values differed
    steps_decided: int  # steps where the decision it feeds acted on some rank
    steps_marked: int  # the decision acted, and the values or its outcomes differed
    steps_apart: int  # the decision's outcomes differed across the ranks at the step
    first_differed: StepView | None
    first_marked: StepView | None
    first_apart: StepView | None
    static: tuple[dict, ...] = ()  # the inventory's reads it observes (`with_inventory`)

    @property
    def marked(self) -> bool:
        return self.steps_marked > 0

    def to_json(self) -> dict:
        def view(v: StepView | None):
            return v.to_json() if v is not None else None

        return {
            "name": self.name,
            "kind": self.kind,
            "classic": self.classic,
            "decision": self.decision,
            "reads": self.reads,
            "ranks_read": list(self.ranks_read),
            "steps_read": self.steps_read,
            "steps_compared": self.steps_compared,
            "steps_differed": self.steps_differed,
            "steps_decided": self.steps_decided,
            "steps_marked": self.steps_marked,
            "steps_apart": self.steps_apart,
            "marked": self.marked,
            "first_differed": view(self.first_differed),
            "first_marked": view(self.first_marked),
            "first_apart": view(self.first_apart),
            "static": list(self.static),
        }


@dataclass(frozen=True, slots=True)
class RunSources:
    run_dir: str
    ranks: tuple[int, ...]
    last_step: dict[int, int]  # per rank, the last step it reached
    armed: dict[int, list[str]]  # per rank, the probes its release had
    sources: tuple[SourceRun, ...]
    notes: tuple[str, ...] = field(default=())
    release: dict | None = None  # the inventory joined (`with_inventory`): engine, version, root

    def to_json(self) -> dict:
        return {
            "schema": RUN_SCHEMA,
            "run_dir": self.run_dir,
            "ranks": list(self.ranks),
            "last_step": {str(r): s for r, s in self.last_step.items()},
            "armed": {str(r): a for r, a in self.armed.items()},
            "sources": [s.to_json() for s in self.sources],
            "notes": list(self.notes),
            "release": self.release,
        }


def with_inventory(result: RunSources, inventory: Inventory) -> RunSources:
    """Each probed source with the static reads it observes (file:line, alignment), from the
    inventory of the release the run ran on."""
    sources = []
    for s in result.sources:
        probe = BY_NAME.get(s.name)
        rows = []
        for src in inventory.sources if probe is not None else ():
            method = src.function.rsplit(".", 1)[-1]
            if src.kind != probe.kind or not src.known:
                continue
            if probe.static and method not in probe.static:
                continue
            if not probe.static and src.classic != probe.classic:
                continue
            a = src.alignment
            rows.append(
                {
                    "file": src.file,
                    "line": src.line,
                    "function": src.function,
                    "decisions": list(src.decisions),
                    "alignment": a.mechanism,
                    "covers_pp": a.covers_pp,
                }
            )
        sources.append(replace(s, static=tuple(rows)))
    return replace(result, sources=tuple(sources), release=inventory.release.to_json())


@dataclass
class _Rank:
    lines: dict[int, ev.StepRecord] = field(default_factory=dict)  # step -> its step line
    last: int = -1
    armed: list[str] | None = None


def _read_rank(path: Path) -> _Rank:
    rank = _Rank()
    crashed: list[int] = []
    for _, line in ev.read_steps(path):
        # None: a line cut by a kill; the steps before it still count
        step = line.step if line is not None else None
        if not isinstance(step, int):
            continue
        if line.sources_armed is not None and rank.armed is None:
            rank.armed = list(line.sources_armed)
        if line.crashed:
            crashed.append(step)
            continue
        rank.last = max(rank.last, step)
        if line.recorder_error is None:
            rank.lines.setdefault(step, line)
    for step in crashed:
        # Died inside a step with no line of its own: it never finished that step's decisions
        # (the crash record repeats a written step's number when the forward raised).
        rank.last = max(rank.last, step if step in rank.lines else step - 1)
    return rank


def load_ranks(run_dir: Path) -> dict[int, _Rank]:
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir}: no such run directory")
    files = ev.rank_files(run_dir, ev.RANK_JSONL_GLOB)
    if not files:
        raise RunDirError(f"{run_dir}: no {ev.RANK_JSONL_GLOB} (not a run directory?)")
    ranks = {r: _read_rank(files[r]) for r in sorted(files)}
    recorded = any(
        rank.armed is not None or any(line.sources is not None for line in rank.lines.values())
        for rank in ranks.values()
    )
    if not recorded:
        raise RunDirError(
            f"{run_dir}: no source reads recorded (a run from before the dynamic probes, or a "
            "builtin-engine run: record one with `run --engine sglang`)"
        )
    return ranks


def analyze_run(run_dir: Path) -> RunSources:
    ranks = load_ranks(run_dir)
    names: dict[str, None] = {}
    for rank in ranks.values():
        for line in rank.lines.values():
            names.update(dict.fromkeys(line.sources or {}))
    order = [p for p in BY_NAME if p in names] + sorted(n for n in names if n not in BY_NAME)
    sources = tuple(_source(name, ranks) for name in order)
    notes = []
    if any(s.kind == "clock" and s.steps_differed for s in sources):
        notes.append(
            "clock values are each rank's own time.monotonic(): they differ at almost every "
            "step; a clock source matters where its decision acted (marked) or acted apart."
        )
    return RunSources(
        run_dir=str(run_dir),
        ranks=tuple(ranks),
        last_step={r: rank.last for r, rank in ranks.items()},
        armed={r: rank.armed or [] for r, rank in ranks.items()},
        sources=sources,
        notes=tuple(notes),
    )


def _record(line: ev.StepRecord | None, name: str) -> dict | None:
    if line is None:
        return None
    rec = (line.sources or {}).get(name)
    return rec if isinstance(rec, dict) else None


def _step_view(name: str, step: int, ranks: dict[int, _Rank], read_by: set[int]) -> StepView:
    """What each rank read at `step` and what its decision did; adds the readers to read_by."""
    values: dict[int, list | None] = {}
    outcomes: dict[int, list] = {}
    for r, rank in ranks.items():
        if step > rank.last:
            continue  # never got there (died, or the run ended first)
        rec = _record(rank.lines.get(step), name)
        was_read = rec is not None and bool(rec.get("n"))  # a decision alone reads nothing
        values[r] = list(rec.get("v") or []) if was_read else None
        outcomes[r] = list(rec.get("d") or []) if rec is not None else []
        if was_read:
            read_by.add(r)
    return StepView(step, values, outcomes)


def _source(name: str, ranks: dict[int, _Rank]) -> SourceRun:
    steps = sorted(
        {s for rank in ranks.values() for s, line in rank.lines.items() if _record(line, name)}
    )
    read_by: set[int] = set()
    counts = dict.fromkeys(("read", "compared", "differed", "decided", "marked", "apart"), 0)
    first: dict[str, StepView | None] = dict.fromkeys(("differed", "marked", "apart"))
    for step in steps:
        view = _step_view(name, step, ranks, read_by)
        values, outcomes = view.values, view.outcomes
        read = [v for v in values.values() if v is not None]
        differed = len(read) >= 2 and any(v != read[0] for v in read[1:])
        apart = len(outcomes) >= 2 and any(
            d != next(iter(outcomes.values())) for d in outcomes.values()
        )
        counts["read"] += bool(read)
        counts["compared"] += len(read) >= 2
        counts["differed"] += differed
        counts["decided"] += view.decided
        # Marked: apart where the decision was taken, in what the ranks read or in what their
        # decision made of it (an idle rank's read is not kept, but its decision did nothing).
        marked = view.decided and (differed or apart)
        counts["marked"] += marked
        counts["apart"] += apart
        for key, hit in (("differed", differed), ("marked", marked), ("apart", apart)):
            if hit and first[key] is None:
                first[key] = view
    probe = BY_NAME.get(name)
    return SourceRun(
        name=name,
        kind=probe.kind if probe else "unknown",
        classic=probe.classic if probe else None,
        decision=probe.decision if probe else "unknown",
        reads=probe.reads if probe else "",
        ranks_read=tuple(sorted(read_by)),
        steps_read=counts["read"],
        steps_compared=counts["compared"],
        steps_differed=counts["differed"],
        steps_decided=counts["decided"],
        steps_marked=counts["marked"],
        steps_apart=counts["apart"],
        first_differed=first["differed"],
        first_marked=first["marked"],
        first_apart=first["apart"],
    )
