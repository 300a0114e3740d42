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

import copy
import signal
from typing import Any

from hicache_diag.diagnosis.tracebacks import parse_crash
from hicache_diag.rules.signatures import LAUNCHER_TEARDOWN_RE


def with_logged_crashes(
    launcher: dict[str, Any] | None, logs: dict[int, str], server_log: str
) -> dict[str, Any] | None:
    """A copy of an sglang run's launcher.json with its rank states and first failure as the
    rank logs' tracebacks and the server log's teardown line show them."""
    if not launcher or (launcher.get("hang") or {}).get("detected_by") == "sglang-watchdog":
        return launcher
    out = copy.deepcopy(launcher)
    entries = [e for e in out.get("ranks") or [] if isinstance(e, dict) and "rank" in e]
    crashes = {}
    for rank, text in logs.items():
        crash = parse_crash(rank, text)
        if crash is not None and crash.fatal:
            crashes[rank] = crash
    for e in entries:
        if int(e["rank"]) in crashes and e.get("state") in ("exited", "crashed"):
            e["state"] = "crashed"
    primary = [c for c in crashes.values() if c.kind != "secondary"]
    if not primary or not LAUNCHER_TEARDOWN_RE.search(server_log):
        return out  # only cascades: a death without a traceback may be the root (SIGKILL)
    first = min(primary, key=lambda c: (c.t or 0.0, c.rank))
    for e in entries:
        # Log times have whole seconds: a SIGKILL from the same second on is the teardown.
        ended = e.get("ended_at")
        after = first.t is None or ended is None or ended >= first.t
        sigkilled = e.get("state") == "crashed" and e.get("signal") == signal.SIGKILL
        if int(e["rank"]) not in crashes and sigkilled and after:
            e["state"] = "killed"
    e = next((e for e in entries if int(e["rank"]) == first.rank), None)
    if e is not None:
        out["first_failure"] = {"rank": e["rank"], "t": first.t or e.get("ended_at"),
                                "pid": e.get("pid"), "exitcode": e.get("exitcode"),
                                "signal": e.get("signal")}  # fmt: skip
    return out
