"""Take py-spy stack dumps of many processes in parallel under one deadline.

Read-only towards the targets: we only run `py-spy dump` (which attaches with ptrace and detaches
again); a py-spy that overruns the deadline is killed, never the process it inspects.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import psutil

PTRACE_HINT = (
    "ptrace denied: run as root or grant CAP_SYS_PTRACE (docker: --cap-add SYS_PTRACE), "
    "or set kernel.yama.ptrace_scope=0"
)
NOT_INSTALLED = "py-spy not installed (pip install py-spy)"
STOPPED = (
    "py-spy could not suspend the process ({status}): it is stopped (SIGSTOP, a debugger) or "
    "stuck in the kernel"
)


@dataclass(slots=True)
class DumpResult:
    """One py-spy dump: `threads` is the parsed `py-spy dump --json` list, or None with `error`."""

    pid: int
    threads: list[dict[str, Any]] | None
    error: str | None
    elapsed_s: float

    @property
    def ok(self) -> bool:
        return self.threads is not None


def find_pyspy() -> str | None:
    """The py-spy binary: next to this interpreter first (skips slow pyenv shims), then PATH."""
    for folder in (sysconfig.get_path("scripts"), os.path.dirname(sys.executable)):
        candidate = os.path.join(folder, "py-spy")
        if os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("py-spy")


def classify_error(pid: int, stderr: str, returncode: int) -> str:
    """Turn py-spy's multi-line anyhow error into one line a user can act on."""
    text = stderr.lower()
    if "permission denied" in text or "operation not permitted" in text:
        return _denied(pid)
    if not psutil.pid_exists(pid) or "no such process" in text:
        return f"no such process: {pid}"
    if "failed to suspend process" in text:
        return STOPPED.format(status=_status(pid))
    if "python version" in text or "python interpreter" in text or "not a python" in text:
        return f"not a Python process: {pid}"
    if "no such file or directory" in text:  # a live pid with no /proc/PID/exe: a kernel thread
        return _not_python(pid) if psutil.pid_exists(pid) else f"no such process: {pid}"
    first = next((ln.strip() for ln in stderr.splitlines() if ln.strip()), "")
    return first.removeprefix("Error: ") or f"py-spy exited with status {returncode}"


def _denied(pid: int) -> str:
    """Permission denied: ptrace rights are the usual cause (even root lacks CAP_SYS_PTRACE in
    a default container), but not when the target is no Python process at all (pid 1, a
    shell): then say that, instead of sending the user after ptrace rights."""
    try:
        proc = psutil.Process(pid)
        what = " ".join(proc.cmdline()[:1]) or proc.name()
    except psutil.Error:
        return PTRACE_HINT
    if any(k in what.lower() for k in ("python", "::scheduler", "sglang", "hicache")):
        return PTRACE_HINT
    return f"not a Python process: {pid} ({what}); give the scheduler processes' pids"


def _not_python(pid: int) -> str:
    """A process py-spy cannot read as Python (a kernel thread has no executable at all)."""
    try:
        proc = psutil.Process(pid)
        name, exe = proc.name(), proc.exe()
    except psutil.Error:
        return f"not a Python process: {pid}; give the scheduler processes' pids"
    what = name if exe else f"{name}, a kernel thread"
    return f"not a Python process: {pid} ({what}); give the scheduler processes' pids"


def _status(pid: int) -> str:
    try:
        return str(psutil.Process(pid).status())
    except psutil.Error:
        return "state unknown"


def _command(binary: str, pid: int, native: bool) -> list[str]:
    cmd = [binary, "dump", "--json", "--pid", str(pid)]
    if native:
        cmd.append("--native")
    return cmd


def _parse(pid: int, out: str, err: str, returncode: int, elapsed: float) -> DumpResult:
    if returncode != 0:
        return DumpResult(pid, None, classify_error(pid, err, returncode), elapsed)
    try:
        threads = json.loads(out)
    except json.JSONDecodeError as exc:
        return DumpResult(pid, None, f"unreadable py-spy output: {exc}", elapsed)
    if not isinstance(threads, list):
        return DumpResult(pid, None, "unexpected py-spy output (not a thread list)", elapsed)
    return DumpResult(pid, threads, None, elapsed)


def _dump_one(binary: str, pid: int, native: bool, deadline: float) -> DumpResult:
    """Run one py-spy; communicate() drains both pipes so a big dump never blocks on a full pipe."""
    started = time.monotonic()
    if not psutil.pid_exists(pid):
        return DumpResult(pid, None, f"no such process: {pid}", 0.0)
    try:
        proc = subprocess.Popen(
            _command(binary, pid, native),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
    except OSError as exc:
        return DumpResult(pid, None, f"{NOT_INSTALLED}: {exc.strerror}", 0.0)
    try:
        out, err = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        # Only our own py-spy child is killed; the kernel detaches ptrace when the tracer dies.
        proc.kill()
        proc.communicate()
        msg = "py-spy timed out (target may be stuck in a syscall or the deadline is too short)"
        return DumpResult(pid, None, msg, time.monotonic() - started)
    return _parse(pid, out, err, proc.returncode, time.monotonic() - started)


def dump_stacks(
    pids: list[int], *, deadline_s: float, native: bool = False
) -> dict[int, DumpResult]:
    """Dump every pid with `py-spy dump --json` in parallel; all results are in by the deadline."""
    unique = list(dict.fromkeys(pids))
    binary = find_pyspy()
    if binary is None:
        return {pid: DumpResult(pid, None, NOT_INSTALLED, 0.0) for pid in unique}
    deadline = time.monotonic() + deadline_s
    if not unique:
        return {}
    with ThreadPoolExecutor(max_workers=len(unique)) as pool:
        futures = {pid: pool.submit(_dump_one, binary, pid, native, deadline) for pid in unique}
        return {pid: fut.result() for pid, fut in futures.items()}
