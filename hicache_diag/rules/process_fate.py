"""Process fate: who stopped whom, read from the log (the launcher's SIGTERM / SIGQUIT chain,
a child's exit signal, NCCL's abort), so an operator's stop is never taken for the crash.

SGLang's launcher on SIGTERM logs `SIGTERM received ... Draining requests and shutting
down...`; its SubprocessWatchdog then reports each child that died (`Subprocess scheduler_0
(pid=N) crashed with exit code -15. Triggering SIGQUIT for cleanup...`), the SIGQUIT handler
logs `SIGQUIT received ...` and `kill_process_tree called`. A negative exit code is the signal
that ended the child: SIGTERM (15) and SIGINT (2) come from outside (the operator, the
orchestrator, the launcher's teardown); SIGKILL (9) is the OOM killer or `kill -9`; SIGSEGV
(11) or SIGABRT (6) is the child's own crash.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from hicache_diag.rules.rank_fate import RankFate


class Fate(str, enum.Enum):
    OPERATOR_STOP = "operator-stop"  # SIGTERM / SIGINT from outside: someone stopped the server
    TEARDOWN = "teardown"  # the launcher tearing its tree down (SIGQUIT chain, kill_process_tree)
    CHILD_EXIT = "child-exit"  # a child's exit reported by its parent (code in FateFact.code)
    NCCL_ABORT = "nccl-abort"  # NCCL's watchdog / heartbeat monitor terminates the process


# Signals that stop a process from outside; the child did not fail on its own.
STOP_SIGNALS = frozenset({2, 15})
SIGNAL_NAMES = {2: "SIGINT", 3: "SIGQUIT", 6: "SIGABRT", 9: "SIGKILL", 11: "SIGSEGV", 15: "SIGTERM"}

_OPERATOR_STOP = re.compile(
    r"SIGTERM received|Received SIGTERM|received signal (?:SIGTERM|SIGINT|15\b|2\b)"
    r"|Draining requests and shutting down|Gracefully stopping\.\.\. \(press Ctrl\+C again"
    r"|Received SIGINT|Caught SIGTERM|Signal (?:15|2) \(SIG(?:TERM|INT)\) received"
)
_TEARDOWN = re.compile(
    r"SIGQUIT received|Received sigquit from a child process|kill_process_tree called"
    r"|Triggering SIGQUIT for cleanup"
)
# SGLang's SubprocessWatchdog; torchrun's elastic agent (`exitcode: -9`, `Signal 9 (SIGKILL)`).
_CHILD_EXIT = re.compile(
    r"Subprocess (?P<who>\S{1,80}) \(pid=(?P<pid>\d+)\) crashed with exit code (?P<code>-?\d+)"
    r"|(?P<who2>\S{1,80}) FAILED .{0,80}?exitcode\s*:\s*(?P<code2>-?\d+)"
    r"|Signal (?P<sig>\d+) \(SIG[A-Z]+\) received by PID (?P<pid3>\d+)"
)
_NCCL_ABORT = re.compile(r"Terminating the process after attempting to dump debug info")
# After SIGTERM, SGLang's tokenizer manager drains: every 5 s while requests remain it reports
# them (`sigterm_watchdog`, same wording 0.5.12.post1-0.5.23), then stops the schedulers.
_DRAIN_REPORT = re.compile(r"Gracefully exiting\.\.\. Remaining number of requests (\d{1,9})\.")
# What the log reader asks of a line here (logs/triggers.py derives its fast path's words).
FATE_SIGNATURES = (_OPERATOR_STOP, _TEARDOWN, _CHILD_EXIT, _NCCL_ABORT, _DRAIN_REPORT)


@dataclass(frozen=True, slots=True)
class FateFact:
    fate: Fate
    code: int | None = None  # a child's exit code (negative: killed by that signal)
    who: str | None = None  # the child's name or pid as the line gives it

    @property
    def signal(self) -> int | None:
        return -self.code if self.code is not None and self.code < 0 else None

    @property
    def stopped_from_outside(self) -> bool:
        """The child was stopped by a stop signal (SIGTERM, SIGINT), not by a failure of its own."""
        return self.fate is Fate.OPERATOR_STOP or (
            self.fate is Fate.CHILD_EXIT and self.signal in STOP_SIGNALS
        )

    def describe(self) -> str:
        if self.fate is Fate.CHILD_EXIT and self.code is not None:
            how = SIGNAL_NAMES.get(self.signal or 0, f"signal {self.signal}")
            end = f"was killed by {how}" if self.signal else f"exited with code {self.code}"
            return f"{self.who or 'a child'} {end}"
        return {
            Fate.OPERATOR_STOP: "the server was stopped from outside (SIGTERM / SIGINT)",
            Fate.TEARDOWN: "the launcher tore its process tree down",
            Fate.NCCL_ABORT: "NCCL's watchdog terminated the process",
        }.get(self.fate, self.fate.value)


def read_fate(text: str) -> FateFact | None:
    """What one log line says about a process's fate; None when it says nothing of it."""
    if "SIG" not in text and "exit" not in text and "kill" not in text and "Term" not in text:
        if "Draining" not in text and "Gracefully" not in text:
            return None
    if m := _CHILD_EXIT.search(text):
        if m["sig"]:
            return FateFact(Fate.CHILD_EXIT, -int(m["sig"]), f"pid {m['pid3']}")
        code = m["code"] if m["code"] is not None else m["code2"]
        return FateFact(Fate.CHILD_EXIT, int(code), m["who"] or m["who2"])
    if _OPERATOR_STOP.search(text):
        return FateFact(Fate.OPERATOR_STOP)
    if _TEARDOWN.search(text):
        return FateFact(Fate.TEARDOWN)
    if _NCCL_ABORT.search(text):
        return FateFact(Fate.NCCL_ABORT)
    return None


def drain_remaining(text: str) -> int | None:
    """The requests still in flight that a drain report after SIGTERM names; None when the
    line is no drain report."""
    m = _DRAIN_REPORT.search(text) if "Gracefully" in text else None
    return int(m[1]) if m else None


# py-spy's own words about the process it could not read (its stderr, or SGLang's `Pyspy
# failed ... Error: ...` line quoting it): the process is gone (`No such process`, ESRCH from
# ptrace / waitpid), or it is stopped (`Failed to suspend process`, a waitpid status naming
# SIGSTOP, `Stopped(Pid(..), SIGSTOP)`). Missing py-spy or ptrace rights say nothing of it.
_PYSPY_GONE = re.compile(
    r"No such process|\bESRCH\b|process \d{1,10} (?:has )?(?:exited|gone)", re.I
)
_PYSPY_SIGSTOP = re.compile(r"SIGSTOP|Stopped\(Pid|\(stopped\)")
_PYSPY_TOOLING = re.compile(
    r"not found|No such file|Permission denied|Operation not permitted|\bEPERM\b", re.I
)


def pyspy_fate(text: str, gave_up: bool = False) -> RankFate | None:
    """What py-spy's failure says of the process: STOPPED, EXITED, or None (a tool problem or
    nothing said). A status naming SIGSTOP outranks `No such process` (a thread of a stopped
    process), which outranks `Failed to suspend process`. `gave_up`: SGLang's `All pyspy dump
    attempts failed` with no cause of the tool's own, which an unsuspendable process causes."""
    if _PYSPY_SIGSTOP.search(text):
        return RankFate.STOPPED
    if _PYSPY_GONE.search(text):
        return RankFate.EXITED
    # A suspend refused for want of permission (ptrace denied) says nothing of the process.
    tooling = _PYSPY_TOOLING.search(text)
    suspend = "Failed to suspend" in text or "could not suspend" in text
    if (suspend or gave_up) and not tooling:
        return RankFate.STOPPED
    return None
