"""Two incidents in one log: a server that failed, was restarted and failed again weeks later
writes both into the same file (a rotated log appended to, a collector's history). A silence
longer than INCIDENT_GAP between two stamped lines ends an incident: what came before is set
aside with one note, and triage reads the latest, never joins a crash of one day to a hang of
another."""

from __future__ import annotations

from datetime import datetime

from hicache_diag.logs.block import Block
from hicache_diag.logs.model import LogEvidence

INCIDENT_GAP_S = 6 * 3600  # a busy or idle server's log is never silent this long


def _when(ts: str) -> datetime | None:
    try:
        return datetime.fromisoformat(ts[:19].replace(",", ".").replace("T", " "))
    except ValueError:
        return None


def gap_s(before: str | None, after: str | None) -> float:
    """Seconds from one full stamp to a later one (0 when either lacks a date)."""
    if not before or not after or len(before) < 19 or len(after) < 19:
        return 0.0
    a, b = _when(before), _when(after)
    return (b - a).total_seconds() if a and b else 0.0


def describe(ev: LogEvidence, first: str | None, last: str | None, lines: int) -> str:
    """The note an earlier incident leaves: when, how long ago, what it held."""
    if ev.exceptions:
        what = f"first error {ev.exceptions[0].text[:100]}"
    elif ev.hang_lines:
        what = f"a timeout: {ev.hang_lines[0].text[:100]}"
    elif ev.progress_count:
        what = f"{ev.progress_count} progress lines"
    else:
        what = "nothing decisive"
    return (
        f"an earlier incident ({first or '?'} to {last or '?'}, {lines} lines: {what}) is set "
        f"aside: more than {INCIDENT_GAP_S // 3600} h of silence follow it, and triage reads "
        "the latest incident"
    )


def gap_inside(block: Block, stamp: str | None) -> bool:
    """A silence longer than INCIDENT_GAP_S after the latest stamp so far (`stamp`, then the
    Block's own lines): looked for only where the hour changes."""
    hour = stamp[:13] if stamp else None
    for k in range(block.start, len(block.raw)):
        ts = block.raw[k][1:20]
        if ts[:13] != hour:
            if gap_s(stamp, ts) > INCIDENT_GAP_S:
                return True
            hour = ts[:13]
        if stamp is None or ts > stamp:
            stamp = ts  # the latest: a paste may go back in time
    return False
