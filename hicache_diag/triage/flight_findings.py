"""What Flight Recorder dumps say of a hang: per process group, the collective (by its sequence
number) that some member never entered, or entered as another operation than its peers (a
desync: the ranks issued different collective sequences), with the call sites of both sides.
The rank missing from a collective is the culprit its peers wait for; with NCCL the states say
who is still waiting (`started`, never `completed`), with gloo nothing is ever marked completed
and the findings say that instead of reading `scheduled` as stuck."""

from __future__ import annotations

from dataclasses import dataclass, field

from hicache_diag.triage.flight_recorder import FrDump, FrEntry


@dataclass(slots=True)
class FlightFinding:
    group: str
    desc: str
    seq: int
    op: str  # what the waiting ranks entered
    missing: list[int]  # ranks that never entered it (or entered something else)
    waiting: list[int]  # ranks inside it
    evidence: list[str] = field(default_factory=list)


@dataclass(slots=True)
class FlightEvidence:
    dumps: list[FrDump]
    findings: list[FlightFinding]
    notes: list[str]

    @property
    def culprits(self) -> list[int]:
        """The global ranks missing from the first stuck collective."""
        return self.findings[0].missing if self.findings else []


def _memberships(dumps: list[FrDump]) -> dict[str, set[int]]:
    """group -> its ranks: torch's builder reads them (and checks the ranks agree) where torch
    is there; else the union of what the dumps say."""
    config = {
        d.rank: {g: {"desc": d.descs.get(g, ""), "ranks": str(r)} for g, r in d.members.items()}
        for d in dumps
    }
    try:
        import logging

        # torch's recorder logs to stderr on import (a missing `tabulate`): not ours to print.
        logging.getLogger("Flight Recorder").disabled = True
        from torch.distributed.flight_recorder.components.builder import (
            build_groups_memberships,
        )

        _, _, _, memberships, guids = build_groups_memberships(config)
        return {g: set(memberships[guid]) for (g, _rank), guid in guids.items()}
    except Exception:  # noqa: BLE001 - no torch, or ranks that disagree: what the dumps say
        out: dict[str, set[int]] = {}
        for d in dumps:
            for g, ranks in d.members.items():
                out.setdefault(g, set()).update(ranks)
        return out


def _where(entry: FrEntry | None) -> str:
    if entry is None:
        return "no operation recorded"
    site = f" at {entry.site}" if entry.site else ""
    return f"{entry.op} #{entry.seq}{site}"


def _group_finding(group: str, members: set[int], dumps: list[FrDump]) -> FlightFinding | None:
    by_rank = {
        d.rank: {e.seq: e for e in d.entries if e.group == group and not e.is_p2p} for d in dumps
    }
    present = sorted(r for r in members if r in by_rank)
    if len(present) < 2:
        return None
    top = max((max(by_rank[r], default=0) for r in present), default=0)
    for seq in range(min((min(by_rank[r], default=top) for r in present), default=top), top + 1):
        ops = {r: by_rank[r].get(seq) for r in present}
        names = {e.op for e in ops.values() if e is not None}
        if len(names) > 1 or any(e is None for e in ops.values()):
            return _mismatch(group, seq, ops, dumps)
    return None


def _mismatch(group: str, seq: int, ops: dict[int, FrEntry | None], dumps) -> FlightFinding:
    """The first collective the members disagree on: the op most of them entered and the
    ranks that did not (or entered another) are its culprits; with no majority (two ranks,
    one op each) the ranks disagree and none is named."""
    entered = [e.op for e in ops.values() if e is not None]
    op = max(sorted(set(entered)), key=entered.count)
    waiting = sorted(r for r, e in ops.items() if e is not None and e.op == op)
    others = sorted(r for r in ops if r not in waiting)
    desc = next((e.desc for e in ops.values() if e is not None), "")
    name = f"{desc or group} collective #{seq}"
    sides = [f"rank {r}: {_where(ops.get(r) or _last(dumps, r, group))}" for r in sorted(ops)]
    if len(others) >= len(waiting):
        ev = [f"Flight Recorder: the ranks disagree on {name}: no majority names a culprit"]
        return FlightFinding(group, desc, seq, op, [], [], ev + sides[:8])
    ev = [
        f"Flight Recorder: {name} ({op}): rank(s) {', '.join(map(str, waiting))} entered it, "
        f"rank(s) {', '.join(map(str, others))} did not: the peers wait for them"
    ]
    return FlightFinding(group, desc, seq, op, others, waiting, ev + sides[:8])


def _last(dumps: list[FrDump], rank: int, group: str) -> FrEntry | None:
    dump = next((d for d in dumps if d.rank == rank), None)
    entries = [e for e in dump.entries if e.group == group] if dump else []
    return entries[-1] if entries else None


def _same_repairs(repairs: list[str]) -> list[str]:
    """One line per repair, the ranks it was made for listed once."""
    by_text: dict[str, list[str]] = {}
    for r in repairs:
        head, _, text = r.partition(": ")
        by_text.setdefault(text, []).append(head.removeprefix("rank "))
    return [f"rank(s) {', '.join(ranks)}: {text}" for text, ranks in by_text.items()]


def analyse(dumps: list[FrDump]) -> FlightEvidence:
    """The findings over every group the dumps name, the repairs made and what the backend
    cannot show."""
    notes = _same_repairs([r for d in dumps for r in d.repairs])
    backends = sorted({d.backend for d in dumps})
    if "gloo" in backends:
        notes.append(
            "gloo: the recorder never marks a collective completed, so an entry's state says "
            "nothing (read as unknown); gloo records no point-to-point operation, so a PP "
            "send/recv wait cannot show in these dumps"
        )
    memberships = _memberships(dumps)
    missing_dumps = sorted(set().union(*memberships.values()) - {d.rank for d in dumps})
    if missing_dumps:
        notes.append(f"no dump from rank(s) {', '.join(map(str, missing_dumps))}")
    findings = [
        f for g, m in sorted(memberships.items()) if (f := _group_finding(g, m, dumps)) is not None
    ]
    stuck = [e for d in dumps for e in d.entries if e.state == "started"]
    if stuck and not findings:
        first = min(stuck, key=lambda e: e.seq)
        notes.append(f"rank {first.rank} is still inside {_where(first)} (started, not completed)")
    head = f"Flight Recorder: {len(dumps)} dump(s), {', '.join(backends)}, version "
    head += ", ".join(sorted({d.version for d in dumps}))
    return FlightEvidence(dumps, findings, [head, *notes])
