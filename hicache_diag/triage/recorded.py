"""What triage read of a production recording (`hicache-diag record`): per rank its last step,
its last in-process dump and, when it cannot be compared or asked, why (blind); and the first
step and field where the ranks part (triage/recorded_align.py). Live or offline alike: the
live path (triage/recorded_live.py) adds the process facts, never a guess.

Blind reasons: `recorder off: ...` (its meta's own reason; what it wrote before is compared),
`missing: ...` (no recording of a rank that exists), `stale: ...` (files of another process
than the rank's), `no answer: ...` (asked for a dump, none came; what it recorded is compared).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hicache_diag.evidence.ranks import RankId
from hicache_diag.evidence.recording_scan import RankRead
from hicache_diag.evidence.stacks import RankDump
from hicache_diag.logs.model import LogEvidence
from hicache_diag.triage.parting import Parting
from hicache_diag.triage.recorded_crash import crash_evidence

MAX_SAID = 8  # ranks named per evidence line: a thousand ranks do not fit one
MISSING = "missing: no recording of this rank (launched without `hicache-diag record`?)"


@dataclass(slots=True)
class RecordStatus:
    rank: int | None  # the launch-wide rank its files are named by (rank{r}.*); None: no files
    pp: int | None
    tp: int | None
    pid: int | None
    last_step: int | None
    dumped_at: float | None
    blind: str | None = None
    node: str | None = None

    @property
    def rank_id(self) -> RankId:
        if self.pp is None or self.tp is None:
            return RankId(anon=self.rank or 0, node=self.node)
        return RankId(self.pp, self.tp, node=self.node)

    @property
    def label(self) -> str:
        if self.pp is None and self.rank is not None:  # files without a meta: no PP/TP known
            return f"{self.node} rank {self.rank}" if self.node else f"rank {self.rank}"
        return self.rank_id.label

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "pp": self.pp,
            "tp": self.tp,
            "label": self.label,
            "node": self.node,
            "pid": self.pid,
            "last_step": self.last_step,
            "dumped_at": self.dumped_at,
            "blind": self.blind,
        }


@dataclass(slots=True)
class Recording:
    sessions: list[str]
    ranks: list[RecordStatus]
    parting: Parting | None = None
    evidence: list[str] = field(default_factory=list)
    crashes: LogEvidence = field(default_factory=LogEvidence)  # its crash records, as logged

    def recorded_json(self) -> list[dict[str, Any]]:
        return [r.to_json() for r in self.ranks]

    def first_divergence_json(self) -> dict[str, Any] | None:
        p = self.parting
        if p is None:
            return None
        return {
            "step": p.step,
            "field": p.field,
            "values": p.values,
            "source": p.source,
            "source_rank": p.culprit_rank,
            "reach": p.reach,
            "last_step": p.last_step,
            "fields": p.fields,
        }


@dataclass(slots=True)
class Facts:
    """What the reader knows besides the files. `live`: (pp, tp) -> the live scheduler's pid
    (None offline); `asked`: the dump request's id the ranks were to answer (None: none);
    `answered`: the ranks that answered it; `stacks`: rank -> its last stack, for the idle-slot
    count of a follower waiting for a request list."""

    live: dict[tuple[int, int], int] | None = None
    asked: str | None = None
    answered: set[int] = field(default_factory=set)
    silent: dict[int, str] = field(default_factory=dict)  # rank -> why it could not answer
    stacks: dict[int, RankDump] = field(default_factory=dict)
    expected: set[tuple[int, int]] = field(default_factory=set)  # ranks known to exist
    # A live rank whose environment names a recording that holds no file of it: why
    named: dict[tuple[int, int], str] = field(default_factory=dict)
    node: str | None = None


def _pp_tp(rr: RankRead) -> tuple[int | None, int | None]:
    if rr.meta is None:
        return None, None
    return rr.meta.pp_rank, rr.meta.tp_rank


def _blind(rr: RankRead, facts: Facts) -> str | None:
    meta = rr.meta
    if meta is None:
        return f"missing: rank{rr.rank}.meta.json is not there (its recorder never started)"
    live = facts.live or {}
    pid = live.get((meta.pp_rank, meta.tp_rank))
    if pid is not None and meta.pid not in live.values():  # two launches may share a PP/TP
        return f"stale: its recording is pid {meta.pid}'s, the rank runs as pid {pid}"
    if not meta.on:
        return f"recorder off: {meta.off_reason or 'no reason written'}"
    if facts.asked and rr.rank not in facts.answered:
        why = facts.silent.get(rr.rank, "no in-process dump came back in time")
        return f"no answer: {why}"
    return None


def join(sessions: list[dict[int, RankRead]], notes: list[str]) -> dict[int, RankRead]:
    """Several sessions' ranks (a node's each, or two launches on one node) joined by rank; a
    rank two of them hold is kept from the later-started one, the other said."""
    reads: dict[int, RankRead] = {}
    for got in sessions:
        for r, rr in got.items():
            if r in reads:
                keep, drop = sorted((reads[r], rr), key=_started, reverse=True)
                notes.append(f"rank {r} is in {keep.session} and {drop.session}: the later kept")
                rr = keep
            reads[r] = rr
    return reads


def _started(rr: RankRead) -> float:
    return rr.meta.started_at if rr.meta else 0.0


def _dumped_at(rr: RankRead) -> float | None:
    at = [d.get("at") for d in rr.dumps if isinstance(d.get("at"), int | float)]
    return float(max(at)) if at else None


def _missing(reads: dict[int, RankRead], facts: Facts) -> list[RecordStatus]:
    """A rank known to exist (a live scheduler, a gap in the recorded ranks) with no files."""
    have = {_pp_tp(rr) for rr in reads.values()}
    out = []
    for pp, tp in sorted(facts.expected - have):
        pid = (facts.live or {}).get((pp, tp))
        why = facts.named.get((pp, tp))
        why = f"missing: {why}" if why else MISSING
        out.append(RecordStatus(None, pp, tp, pid, None, None, why, facts.node))
    return out


def read_recording(reads: dict[int, RankRead], sessions: list[str], facts: Facts) -> Recording:
    ranks, compared = [], {}
    for r, rr in sorted(reads.items()):
        pp, tp = _pp_tp(rr)
        pid = rr.meta.pid if rr.meta else None
        blind = _blind(rr, facts)
        ranks.append(RecordStatus(r, pp, tp, pid, rr.last_step, _dumped_at(rr), blind, facts.node))
        if blind is None or blind.startswith(("recorder off", "no answer")):
            compared[r] = rr  # what it wrote while it could is evidence
    ranks += _missing(reads, facts)
    recording = Recording(sessions, ranks)
    named = {r: rr.session for r, rr in reads.items()}
    recording.crashes = crash_evidence(reads, named)
    from hicache_diag.triage.recorded_align import align  # pandas: only with a recording

    recording.parting = align(compared, facts.stacks)
    recording.evidence = _evidence(recording, compared)
    return recording


def _said(items: list[str]) -> str:
    more = f" and {len(items) - MAX_SAID} more" if len(items) > MAX_SAID else ""
    return ", ".join(items[:MAX_SAID]) + more


def _evidence(rec: Recording, compared: dict[int, RankRead]) -> list[str]:
    steps = [f"{r.label} {r.last_step}" for r in rec.ranks if r.last_step is not None]
    lines = [
        f"recording {_said(rec.sessions)}: {len(rec.ranks)} rank(s), last step "
        f"{_said(steps) or 'none written'}"
        if rec.sessions
        else f"recording: no file of any of the {len(rec.ranks)} rank(s) was found"
    ]
    lines += [f"recording: {r.label} is blind ({r.blind})" for r in rec.ranks if r.blind]
    lines += _behind(rec)
    if rec.parting is not None:
        lines += [f"recording: {line}" for line in rec.parting.evidence]
    elif len(compared) >= 2:
        lines.append("recording: the ranks' recorded steps agree (no first divergence)")
    else:
        lines.append("recording: fewer than two ranks can be compared: no divergence is named")
    return lines


def _behind(rec: Recording) -> list[str]:
    """A rank that did not answer and whose recording stops before its peers'."""
    last = [r.last_step for r in rec.ranks if r.last_step is not None and not r.blind]
    if not last:
        return []
    ahead = max(last)
    return [
        f"recording: {r.label}'s last recorded step is {r.last_step}, {ahead - r.last_step} "
        f"step(s) behind its peers' ({ahead})"
        for r in rec.ranks
        if r.blind and r.blind.startswith("no answer") and r.last_step is not None
        if r.last_step < ahead
    ]


def offline_facts(reads: dict[int, RankRead], request: dict | None) -> Facts:
    """A copied folder: no process facts; the last dump request written into it (if any)
    names the ranks that did not answer it; a gap in the recorded ranks is a missing rank."""
    facts = Facts()
    if request and isinstance(request.get("id"), str):
        facts.asked = request["id"]
        facts.answered = {
            r for r, rr in reads.items() if any(d.get("request") == facts.asked for d in rr.dumps)
        }
        for r in set(reads) - facts.answered:
            facts.silent[r] = f"the last dump request ({facts.asked}) has no answer from it"
    tp_size = max((rr.meta.tp_rank for rr in reads.values() if rr.meta), default=0) + 1
    gaps = set(range(max(reads, default=-1) + 1)) - set(reads)
    facts.expected = {(r // tp_size, r % tp_size) for r in gaps}
    return facts
