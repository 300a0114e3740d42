"""The process facts SGLang's log adds to launcher.json, read by the checker (docs/design.md §4:
the runner records what processes did, the classifier judges it with the logs as evidence).

A scheduler whose loop died of an exception crashed, though it may exit 0:
`run_scheduler_process` logs `Scheduler hit an exception`, SIGQUITs the launcher and returns
(seen on 0.5.23). The launcher then SIGKILLs its whole tree, so the others' SIGKILL deaths are
its teardown, and their order in the runner's poll says nothing (seen on 0.5.12.post1: PP0 and
PP1 SIGKILLed 40 us apart after PP1 raised): the first failure is the scheduler that raised
first. Only a root-cause traceback does this: when the only ones are cascades (`Connection
closed by peer`), a SIGKILL death may be the cause itself. When SGLang's own watchdog declared
the hang, every death after it was its teardown and the runner recorded that already.
"""

from __future__ import annotations

import signal
from dataclasses import replace

from hicache_diag import evidence as ev
from hicache_diag.diagnosis.tracebacks import RankCrash, parse_crash
from hicache_diag.rules.signatures import LAUNCHER_TEARDOWN_RE


def with_logged_crashes(
    launcher: ev.LauncherRecord | None, logs: dict[int, str], server_log: str
) -> ev.LauncherRecord | None:
    """An sglang run's launcher.json with its rank states and first failure as the rank
    logs' tracebacks and the server log's teardown line show them (a new record)."""
    if launcher is None or (launcher.hang and launcher.hang.detected_by == "sglang-watchdog"):
        return launcher
    crashes = {}
    for rank, text in logs.items():
        crash = parse_crash(rank, text)
        if crash is not None and crash.fatal:
            crashes[rank] = crash
    entries = [
        replace(e, state="crashed") if e.rank in crashes and e.state in ("exited", "crashed") else e
        for e in launcher.ranks
    ]
    primary = [c for c in crashes.values() if c.kind != "secondary"]
    if not primary or not LAUNCHER_TEARDOWN_RE.search(server_log):
        # only cascades: a death without a traceback may be the root (SIGKILL)
        return replace(launcher, ranks=entries)
    first = min(primary, key=lambda c: (c.t or 0.0, c.rank))
    entries = [_teardown(e, first, crashes) for e in entries]
    e = next((e for e in entries if e.rank == first.rank), None)
    if e is None:
        return replace(launcher, ranks=entries)
    ff = ev.FirstFailure(e.rank, first.t or e.ended_at, e.pid, e.exitcode, e.signal)
    return replace(launcher, ranks=entries, first_failure=ff)


def _teardown(e: ev.RankProcess, first: RankCrash, crashes: dict) -> ev.RankProcess:
    """A SIGKILL death of a rank without a traceback, from the first raise on: the launcher's
    teardown (`killed`). Log times have whole seconds: a SIGKILL from the same second counts."""
    after = first.t is None or e.ended_at is None or e.ended_at >= first.t
    sigkilled = e.state == "crashed" and e.signal == signal.SIGKILL
    if e.rank not in crashes and sigkilled and after:
        return replace(e, state="killed")
    return e
