"""Flight Recorder findings joined with what the stacks and logs of the same ranks decided: a
collective some rank never entered is a hang (form C) whose culprit is that rank, when the
other evidence found a hang with no culprit or could not decide; beside a crash or a named
culprit, the findings are evidence only. Flight Recorder numbers ranks globally: a global rank
becomes PP/TP by the TP size the other evidence shows, else it is read as TP (no PP shown)."""

from __future__ import annotations

from hicache_diag.evidence.ranks import RankId, unflat_rank
from hicache_diag.rules.signatures import Context
from hicache_diag.triage.advice import next_steps
from hicache_diag.triage.flight_findings import FlightEvidence
from hicache_diag.triage.report import RankReport, TriageReport, report_for


def _rank_of(global_rank: int, reports: list[RankReport]) -> tuple[RankId, str | None]:
    known = [r.rank for r in reports if r.rank.known]
    if known:
        tp_size = max(r.tp for r in known) + 1
        pp, tp = unflat_rank(global_rank, tp_size)
        return RankId(pp, tp), None
    note = f"global rank {global_rank} read as TP{global_rank}: the evidence shows no PP or TP"
    return RankId(tp=global_rank), note


def join_flight(report: TriageReport, flight: FlightEvidence) -> TriageReport:
    """The report with the Flight Recorder's findings joined in."""
    lines = list(flight.notes) + [e for f in flight.findings for e in f.evidence]
    culprits = flight.culprits
    decides = report.kind == "unknown" or (report.kind == "hang" and report.culprit is None)
    if not (culprits and decides):
        report.evidence += lines
        return report
    rank, note = _rank_of(culprits[0], report.ranks)
    culprit = report_for(rank, report.ranks)
    culprit.state = "blocked" if culprit.state == "crashed" else culprit.state
    finding = flight.findings[0]
    out = TriageReport(
        "hang",
        form="C",
        culprit=culprit,
        ranks=report.ranks,
        evidence=[*lines, *([note] if note else []), *report.evidence],
        signature=f"{finding.desc or finding.group} collective #{finding.seq} ({finding.op}) "
        f"never entered by rank {culprits[0]}",
        confidence="medium" if report.kind == "unknown" else report.confidence,
        emitter=report.emitter or "scheduler",
        framing=report.framing,
        stack_tree=report.stack_tree,
        samples=report.samples,
    )
    out.next_steps = (
        report.next_steps
        if report.kind == "hang"
        else next_steps("hang", "C", None, None, Context())
    )
    return out
