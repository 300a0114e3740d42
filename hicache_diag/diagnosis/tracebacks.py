"""A rank's log (parsed by triage.logs) -> the crash it hit: exception line, form hint, last
frame and time."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from hicache_diag import evidence as ev
from hicache_diag.logs.crash import crash_form
from hicache_diag.logs.parse import LogException, parse_log_lines
from hicache_diag.rules.signatures import Context


@dataclass(frozen=True, slots=True)
class RankCrash:
    rank: int
    kind: str  # "A" | "B" | "secondary" | "other"
    signature: str  # the exception line
    where: str | None  # the last frame, "func (file.py:line)"
    t: float | None  # when it was logged (epoch seconds), when the log says
    text: str  # the exception lines, one per traceback
    # Logged as `Scheduler hit an exception`: the scheduler loop ended with it, whatever the
    # exit code (SGLang's run_scheduler_process logs it, SIGQUITs its parent and returns 0).
    fatal: bool = False


def _epoch(ts: str | None) -> float | None:
    if not ts:
        return None
    try:
        return datetime.fromisoformat(ts.replace(",", ".")).timestamp()
    except ValueError:
        return None


def _kind(excs: list[LogException], ctx: Context) -> str:
    """The rule book's form (rules.signatures) of any of the rank's exceptions."""
    forms = {crash_form(e, ctx) for e in excs}
    for form in ("A", "B"):
        if form in forms:
            return form
    # The cascade on survivors once a peer died: secondary, never the root cause.
    return "secondary" if any(e.is_cascade for e in excs) else "other"


def parse_crash(rank: int, log: str) -> RankCrash | None:
    """The crash a rank's log shows, or None when it holds no traceback. A chained exception
    counts from its first traceback (where the failure began, and when) to its last (what the
    rank died of)."""
    parsed = parse_log_lines(log.splitlines(), ev.rank_log(".", rank).name)
    excs = [e for e in parsed.exceptions if e.frames]  # tracebacks; fatal one-liners carry none
    if not excs:
        return None
    last = excs[-1]
    text = "\n".join(e.text for e in excs)
    return RankCrash(
        rank,
        _kind(excs, parsed.context),
        last.text,
        last.last_frame,
        _epoch(excs[0].ts),
        text,
        fatal=any(e.scheduler for e in excs),
    )
