"""Text from inputs made safe for a terminal: a log line or an evidence file may hold escape
sequences (a colour left in, a title-setting OSC, a cursor move, a bell) that would act on the
user's terminal when printed. Control characters are shown as `\\x1b`-style escapes instead;
`--json` output needs nothing of this (JSON escapes them itself)."""

from __future__ import annotations

import copy
import re

from hicache_diag.triage.report import TriageReport

# C0 controls but tab and newline, DEL, and the C1 controls (`\x9b` is a CSI of its own).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def safe(text: str | None) -> str | None:
    """`text` with every control character written out as an escape."""
    if text is None or not _CONTROL.search(text):
        return text
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def safe_report(report: TriageReport) -> TriageReport:
    """A copy of the report whose input-derived texts are terminal-safe."""
    out = copy.copy(report)
    out.evidence = [safe(e) or "" for e in report.evidence]
    out.framing = [safe(e) or "" for e in report.framing]
    out.next_steps = [safe(e) or "" for e in report.next_steps]
    out.signature, out.reason, out.emitter = (
        safe(report.signature),
        safe(report.reason),
        safe(report.emitter),
    )
    out.ranks = []
    for rank in report.ranks:
        r = copy.copy(rank)
        r.error, r.site_frame, r.title = safe(r.error), safe(r.site_frame), safe(r.title)
        r.frames = [safe(f) or "" for f in r.frames]
        out.ranks.append(r)
    if report.culprit is not None:
        out.culprit = next((r for r in out.ranks if r.rank == report.culprit.rank), None)
        out.culprit = out.culprit or copy.copy(report.culprit)
    return out
