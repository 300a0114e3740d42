"""Real py-spy on real processes: dumps, dead / non-Python pids, deadline, missing binary."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from hicache_diag.triage import pyspy
from hicache_diag.triage.pyspy import PTRACE_HINT, classify_error, dump_stacks

WAITER = "import time\ndef park():\n    time.sleep(60)\nprint('up', flush=True)\npark()\n"


@pytest.fixture
def python_waiter():
    proc = subprocess.Popen([sys.executable, "-c", WAITER], stdout=subprocess.PIPE, text=True)
    proc.stdout.readline()
    yield proc
    proc.kill()
    proc.wait()
    proc.stdout.close()


@pytest.mark.process
def test_dumps_live_python_process_and_leaves_it_running(no_leftover_processes, python_waiter):
    result = dump_stacks([python_waiter.pid], deadline_s=10)[python_waiter.pid]
    assert result.error is None, result.error
    names = [f["name"] for f in result.threads[0]["frames"]]
    assert names[0] == "park"
    assert python_waiter.poll() is None  # read-only: the target is still alive


@pytest.mark.process
def test_errors_for_dead_and_non_python_pids(no_leftover_processes):
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        time.sleep(0.2)
        results = dump_stacks([sleeper.pid, 2**22 + 12345], deadline_s=10)
        assert results[sleeper.pid].error == f"not a Python process: {sleeper.pid}"
        assert results[2**22 + 12345].error.startswith("no such process")
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.process
def test_deadline_kills_py_spy_not_the_target(no_leftover_processes, python_waiter):
    result = dump_stacks([python_waiter.pid], deadline_s=0.001)[python_waiter.pid]
    assert result.threads is None and "timed out" in result.error
    assert python_waiter.poll() is None


def test_missing_py_spy(monkeypatch):
    monkeypatch.setattr(pyspy, "find_pyspy", lambda: None)
    result = dump_stacks([1], deadline_s=1)[1]
    assert result.error.startswith("py-spy not installed")


def test_error_messages_are_one_actionable_line():
    denied = "Error: Failed to attach\nCaused by:\n  Operation not permitted (os error 1)"
    assert classify_error(os.getpid(), denied, 1) == PTRACE_HINT  # a Python target
    assert "CAP_SYS_PTRACE" in PTRACE_HINT and "ptrace_scope" in PTRACE_HINT
    assert classify_error(1, "Error: something odd\nmore", 1) == "something odd"


def test_denied_on_a_non_python_target_does_not_blame_ptrace(monkeypatch):
    class Init:
        def __init__(self, pid):
            pass

        def cmdline(self):
            return ["/sbin/init"]

    monkeypatch.setattr(pyspy.psutil, "Process", Init)
    msg = classify_error(1, "Error: Permission denied (os error 13)", 1)
    assert msg.startswith("not a Python process: 1 (/sbin/init)") and "ptrace" not in msg
