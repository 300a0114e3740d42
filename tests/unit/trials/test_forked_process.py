"""fork_module: a real fork that must behave like `python -m MODULE ARGS` and never come back."""

from __future__ import annotations

import atexit
import importlib
import json
import os
import signal
import sys

import pytest

from hicache_diag.trials.forked_process import ForkedProcess, fork_module
from tests.conftest import assert_no_children

# The module the child runs. It reports what a fresh interpreter would see, then exits as told.
CHILD = """
import atexit, json, os, signal, sys
mode = sys.argv[1]
atexit.register(lambda: print("child atexit ran", flush=True))
print("to-stderr", file=sys.stderr)
print(json.dumps({
    "argv": sys.argv[1:],
    "argv0": sys.argv[0],
    "name": __name__,
    "env": os.environ.get("FORKEE_ENV"),
    "stdin": sys.stdin.read(),
    "sigterm": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
    "sigint_default": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
    "usr2_ignored": signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN,
}))
if mode == "raise":
    raise ValueError("boom from the child")
if mode == "message":
    sys.exit("fatal: told to stop")
if mode == "sleep":
    import time
    time.sleep(60)
sys.exit(int(mode))
"""


@pytest.fixture
def forkee(tmp_path, monkeypatch):
    (tmp_path / "forkee_mod.py").write_text(CHILD)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "forkee_mod"
    sys.modules.pop("forkee_mod", None)
    assert_no_children()


def _fork(module: str, tmp_path, *args: str) -> tuple[ForkedProcess, object]:
    log_path = tmp_path / "child.log"
    with open(log_path, "ab") as log:
        child = fork_module(module, list(args), log.fileno(), {"FORKEE_ENV": "set"})
    return child, log_path


def _report(log_path) -> dict:
    lines = [ln for ln in log_path.read_text().splitlines() if ln.startswith("{")]
    assert len(lines) == 1, log_path.read_text()
    return json.loads(lines[0])


@pytest.mark.process
def test_child_sees_a_fresh_interpreter_and_exits_with_its_code(forkee, tmp_path):
    marker = tmp_path / "parent_atexit_ran"
    hook = lambda: marker.write_text("x")  # noqa: E731
    atexit.register(hook)
    old_term = signal.signal(signal.SIGTERM, lambda *a: None)
    old_usr2 = signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    try:
        child, log_path = _fork(forkee, tmp_path, "3", "--rank", "1")
        assert child.wait() == 3
    finally:
        atexit.unregister(hook)
        signal.signal(signal.SIGTERM, old_term)
        signal.signal(signal.SIGUSR2, old_usr2)
    rep = _report(log_path)
    assert rep["argv"] == ["3", "--rank", "1"] and rep["argv0"].endswith("forkee_mod.py")
    assert rep["name"] == "__main__" and rep["env"] == "set" and rep["stdin"] == ""
    assert rep["sigterm"], "the parent's Python SIGTERM handler must not survive the fork"
    assert rep["sigint_default"] and rep["usr2_ignored"], "SIG_IGN survives, as over exec"
    text = log_path.read_text()
    assert "to-stderr" in text and "child atexit ran" in text
    assert not marker.exists(), "the parent's atexit hooks must not run in the child"
    assert os.environ.get("FORKEE_ENV") is None, "env goes to the child only"


@pytest.mark.process
def test_uncaught_exception_is_exit_1_with_traceback(forkee, tmp_path):
    child, log_path = _fork(forkee, tmp_path, "raise")
    assert child.wait() == 1
    text = log_path.read_text()
    assert "Traceback (most recent call last):" in text
    assert "ValueError: boom from the child" in text


@pytest.mark.process
def test_exit_with_a_message_is_exit_1_and_the_message(forkee, tmp_path):
    child, log_path = _fork(forkee, tmp_path, "message")
    assert child.wait() == 1
    assert "fatal: told to stop" in log_path.read_text()


@pytest.mark.process
def test_kill_poll_wait_as_popen(forkee, tmp_path):
    child, _ = _fork(forkee, tmp_path, "sleep")
    assert child.poll() is None and child.returncode is None
    child.kill()
    assert child.wait() == -signal.SIGKILL
    assert child.poll() == -signal.SIGKILL
    child.kill()  # after the reap: a no-op, never a signal to a recycled pid


@pytest.mark.process
def test_module_missing_is_exit_1(tmp_path):
    child, log_path = _fork("no_such_module_hicache", tmp_path)
    assert child.wait() == 1
    assert "No module named" in log_path.read_text()
    assert_no_children()


@pytest.mark.process
def test_sitecustomize_runs_again_in_the_child(tmp_path, monkeypatch):
    """Start-up hooks that start threads (test crash injectors, profilers) must see each rank."""
    mark = tmp_path / "site_pids"
    (tmp_path / "sitecustomize.py").write_text(
        f"import os\nopen({str(mark)!r}, 'a').write(str(os.getpid()) + '\\n')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "sitecustomize", raising=False)
    importlib.import_module("sitecustomize")
    (tmp_path / "quiet_mod.py").write_text("pass\n")
    try:
        child, _ = _fork("quiet_mod", tmp_path)
        assert child.wait() == 0
    finally:
        sys.modules.pop("sitecustomize", None)
        sys.modules.pop("quiet_mod", None)
    pids = mark.read_text().split()
    assert pids == [str(os.getpid()), str(child.pid)]


@pytest.mark.process
def test_child_never_unwinds_into_the_parents_stack(forkee, tmp_path):
    """The fork happens deep inside the CLI (typer, run_trial, pytest): the child must end in
    os._exit, never run the finally blocks above fork_module."""
    unwound = tmp_path / "unwound"
    try:
        child, _ = _fork(forkee, tmp_path, "0")
    finally:
        with open(unwound, "a") as fh:
            fh.write(f"{os.getpid()}\n")
    assert child.wait() == 0
    assert unwound.read_text().split() == [str(os.getpid())]
