"""Split a log's errors into what happened before the server was stopped and the teardown
after it: an operator's stop (or a child killed by SIGTERM) is never the root cause, and the
errors the teardown provokes (peers losing their connection, children killed, SIGQUIT chains)
say nothing about why the server was stopped. The dumps and timeouts beside them decide."""

from __future__ import annotations

from dataclasses import dataclass, field

from hicache_diag.logs.model import FateLine, LogEvidence, LogException, LogLine
from hicache_diag.rules import signatures as sig


@dataclass(slots=True)
class Teardown:
    stop: FateLine | None = None  # the first stop from outside
    errors: list[LogException] = field(default_factory=list)  # errors after it (set aside)
    dumps: int = 0  # stacks dumped after it (the teardown's own pictures), set aside

    @property
    def evidence(self) -> list[str]:
        if self.stop is None:
            return []
        ln = self.stop.line
        notes = [
            f"{ln.source}:{ln.lineno}: {self.stop.fact.describe()} ({ln.text[:120]}); what "
            "follows is the teardown, not the cause"
        ]
        if self.errors:
            first = self.errors[0]
            notes.append(
                f"set aside {len(self.errors)} error(s) of the teardown, first: {first.text[:120]}"
            )
        if self.dumps:
            notes.append(
                f"set aside {self.dumps} stack dump(s) taken after the stop: they show the "
                "teardown (a rank waits on a peer already killed), not why the server stopped"
            )
        return notes


def _after(stop: LogLine, source: str, lineno: int, ts: str | None) -> bool:
    """At or after the stop: in its own file by position, in another file by time stamp."""
    if source == stop.source:
        return lineno >= stop.lineno
    return bool(ts and stop.ts and ts[:19] >= stop.ts[:19])


def _divergence(exc: LogException, logs: LogEvidence) -> bool:
    """A divergence error (form A/B text) is the cause whenever it happens."""
    return sig.crash_form(exc.text, exc.frames, logs.context) is not None


def set_aside_teardown(logs: LogEvidence) -> Teardown:
    """Remove from `logs` the errors and cascade lines at or after the first stop from outside;
    return them with the stop, for the report's evidence."""
    stop = logs.first_stop()
    if stop is None:
        return Teardown()
    at = stop.line
    kept, torn = [], []
    for exc in logs.exceptions:
        late = _after(at, exc.source, exc.lineno, exc.ts)
        (torn if late and not _divergence(exc, logs) else kept).append(exc)
    logs.exceptions = kept
    logs.cascade_lines = [
        ln for ln in logs.cascade_lines if not _after(at, ln.source, ln.lineno, ln.ts)
    ]
    late_dumps = [
        d for d in logs.dumps if d.lineno and d.source == at.source and d.lineno > at.lineno
    ]
    logs.dumps = [d for d in logs.dumps if d not in late_dumps]
    return Teardown(stop, torn, len(late_dumps))
