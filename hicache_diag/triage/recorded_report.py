"""A production recording's findings beside the verdict: its evidence lines after the
verdict's own, its ranks and first divergence in the report (`recorded`, `first_divergence`),
and, on a live server that records nothing, how to make the next incident tell more."""

from __future__ import annotations

from hicache_diag.triage.recorded import Recording
from hicache_diag.triage.report import TriageReport

RECORD_HINT = (
    "for the first divergent step and field next time, launch the server through the "
    "recorder: `hicache-diag record -- <your launch command>` (or its environment-only form, "
    "`hicache-diag record --print-env`)"
)


def attach_recording(report: TriageReport, recording: Recording | None, live: bool) -> None:
    if recording is None:
        if live:
            report.next_steps.append(RECORD_HINT)
        return
    report.recording = recording
    report.evidence += recording.evidence
