"""Ack latency table from a run directory's recorded HiCache events (`timeline`); ours.

Every number comes from `rank{r}.jsonl`: the step at which the runtime recorded a load or write
as issued, its ack as queued, and the ack as consumed by `check_hicache_events`. The prefill
launch is a step whose batch had a host hit and whose load and follow-up write were both seen
through to consumption; the table shows the earliest consumption seen over all such prefills
(the loop's structural latency; every observation stays in `observed`). The formula is printed
beside the measurement, never used for it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hicache_diag import evidence
from hicache_diag.errors import HicacheDiagError, RunDirError

SCHEMA = "hicache-diag/timeline/v1"
KINDS = ("load", "write")


@dataclass(frozen=True, slots=True)
class TimelineEvent:
    event: str  # "load" or "write"
    issued_iter: int  # all iterations relative to the prefill launch step
    ack_queued_iter: int
    ack_consumed_iter: int
    ack_id: int

    @property
    def delay_iters(self) -> int:
        return self.ack_consumed_iter

    def to_json(self) -> dict[str, Any]:
        return {
            "event": self.event,
            "issued_iter": self.issued_iter,
            "ack_queued_iter": self.ack_queued_iter,
            "ack_consumed_iter": self.ack_consumed_iter,
            "delay_iters": self.delay_iters,
            "ack_id": self.ack_id,
        }


@dataclass(frozen=True, slots=True)
class TimelineTable:
    loop_size: int
    pp: int
    async_depth: int
    rank: int
    rid: str
    launch_step: int
    events: tuple[TimelineEvent, ...]
    ranks_agree: bool
    run_dir: str | None
    samples: int = 1
    observed: dict[str, dict[int, int]] = field(default_factory=dict)

    def formula(self, event: str) -> tuple[str, int]:
        """What the PP event loop's order predicts (docs/design.md §7): (text, value)."""
        if event == "load":
            return "next check = +1", 1
        n = self.loop_size
        return f"(loop {n} - 1) + next check = +{n}", n

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "loop_size": self.loop_size,
            "pp": self.pp,
            "async_depth": self.async_depth,
            "rank": self.rank,
            "rid": self.rid,
            "launch_step": self.launch_step,
            "ranks_agree": self.ranks_agree,
            "samples": self.samples,
            "observed": {k: {str(d): n for d, n in v.items()} for k, v in self.observed.items()},
            "run_dir": self.run_dir,
            "events": [e.to_json() for e in self.events],
            "formula": {e.event: self.formula(e.event)[1] for e in self.events},
        }


def load_rank_records(run_dir: Path, rank: int) -> list[evidence.StepRecord]:
    path = evidence.rank_jsonl(run_dir, rank)
    if not path.is_file():
        raise RunDirError(f"{path} is missing; not a run directory of a finished run")
    rows = []
    for _, rec in evidence.read_steps(path):
        if rec is None:
            break  # a killed rank may leave a torn last line
        rows.append(rec)
    return sorted(rows, key=lambda r: r.step)


def _flat_events(rows: list[evidence.StepRecord]) -> list[tuple[int, dict[str, Any]]]:
    return [(row.step, e) for row in rows for e in row.events or []]


def _first(events, kind: str, phase: str, since: int, match) -> tuple[int, dict] | None:
    for step, ev in events:
        if step >= since and ev["event"] == kind and ev["phase"] == phase and match(ev):
            return step, ev
    return None


def _lifecycle(events, kind: str, launch: int, match) -> TimelineEvent | None:
    """issued -> queued -> consumed of the first `kind` op at or after `launch` that `match`es."""
    issued = _first(events, kind, "issued", launch, match)
    if issued is None:
        return None
    ack_id = issued[1]["ack_id"]
    same = lambda ev: ev["ack_id"] == ack_id  # noqa: E731
    queued = _first(events, kind, "queued", issued[0], same)
    consumed = _first(events, kind, "consumed", issued[0], same)
    if queued is None or consumed is None:
        return None
    return TimelineEvent(
        kind, issued[0] - launch, queued[0] - launch, consumed[0] - launch, int(ack_id)
    )


Sample = tuple[int, str, tuple[TimelineEvent, ...]]


def measure_rank(rows: list[evidence.StepRecord]) -> list[Sample]:
    """(launch step, rid, (load, write)) of every host-hit prefill seen to completion."""
    events = _flat_events(rows)
    samples = []
    for row in rows:
        hits = {rid: n for rid, n in (row.host_hit_len or {}).items() if n > 0}
        launch = row.step
        issued = _first(events, "load", "issued", launch, lambda ev: ev.get("node_ids"))
        if not hits or issued is None or issued[0] != launch:
            continue
        node = issued[1]["node_ids"][0]
        load = _lifecycle(events, "load", launch, lambda ev, n=node: n in ev.get("node_ids", []))
        # The prefill's own write: a new node below the node it loaded back.
        below = lambda ev, n=node: n in ev.get("ancestor_ids", [])  # noqa: E731
        write = _lifecycle(events, "write", launch, below)
        if load and write:
            samples.append((launch, next(iter(hits)), (load, write)))
    return samples


def _delays(sample: Sample) -> tuple[int, ...]:
    return tuple(e.delay_iters for e in sample[2])


def _earliest(samples: list[Sample]) -> Sample:
    """The first sample whose acks were consumed earliest. An ack is consumed at the first ①
    that finds its copy done; on a GPU a few-KB copy is done long before the next ①, so the
    earliest consumption seen is the pipeline's structural latency. A later one only means our
    CPU copy thread lost the GIL race on a busy machine (the JSON keeps every observation)."""
    return min(samples, key=lambda s: (sum(_delays(s)), s[0]))


def compute_timeline(run_dir: Path, pp: int, async_depth: int, rank: int = 0) -> TimelineTable:
    samples = measure_rank(load_rank_records(run_dir, rank))
    if not samples:
        raise HicacheDiagError(
            f"no prefill with a host hit and a consumed load and write ack in "
            f"{evidence.rank_jsonl(run_dir, rank)}; the workload produced no host hits (try more "
            "--requests)"
        )
    launch, rid, events = _earliest(samples)
    others = [
        [_delays(s) for s in measure_rank(load_rank_records(run_dir, r))]
        for r in range(pp)
        if r != rank and evidence.rank_jsonl(run_dir, r).is_file()
    ]
    mine = [_delays(s) for s in samples]
    observed = {
        kind: dict(sorted(Counter(d[i] for d in mine).items())) for i, kind in enumerate(KINDS)
    }
    return TimelineTable(
        loop_size=pp + async_depth,
        pp=pp,
        async_depth=async_depth,
        rank=rank,
        rid=rid,
        launch_step=launch,
        events=events,
        ranks_agree=all(o == mine for o in others),
        run_dir=str(run_dir),
        samples=len(samples),
        observed=observed,
    )
