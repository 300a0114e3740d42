"""Shared fixtures: no test may leave a child process behind."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

# multiprocessing's own helper lives as long as the test process; it is not ours to reap.
_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def live_children() -> list[psutil.Process]:
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            helper = any(h in " ".join(p.cmdline()) for h in _HELPERS)
            if p.status() != psutil.STATUS_ZOMBIE and not helper:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def assert_gone(
    find: Callable[[], list[psutil.Process]], timeout_s: float, poll_s: float, what: str
) -> None:
    """The processes `find` lists get `timeout_s` to finish exiting; any still alive fail the
    test (and are killed, so one failure does not cascade into the next test)."""
    deadline = time.time() + timeout_s
    while (left := find()) and time.time() < deadline:
        time.sleep(poll_s)
    for p in left:
        try:
            p.kill()
        except psutil.Error:
            pass
    assert not left, f"{what}: {[(p.pid, p.cmdline()[:5]) for p in left]}"


def assert_no_children(timeout_s: float = 5.0) -> None:
    """This process's children, gone within `timeout_s` (assert_gone)."""
    assert_gone(live_children, timeout_s, 0.1, "leftover processes")


@pytest.fixture
def no_leftover_processes():
    """Assert after the test that every process it started is gone."""
    yield
    assert_no_children()


@pytest.fixture(autouse=True)
def _stop_multiprocessing_resource_tracker():
    """A test that used multiprocessing leaves its resource tracker running for the session;
    stop it after the test, so the next test's own no-leftover check does not see it.
    (multiprocessing restarts it on demand.)"""
    yield
    from multiprocessing import resource_tracker

    tracker = resource_tracker._resource_tracker
    if getattr(tracker, "_pid", None) is not None and hasattr(tracker, "_stop"):
        tracker._stop()


# Tiers (pyproject markers): unit, cli and hostile tests are process-free unless marked
# `process`;
# e2e tests start the runtime (`process`); tests/test_packaging.py builds wheels and venvs
# (`packaging`, `process`). `-m "not process"` is the fast, process-free tier.
_PROCESS_FREE_DIRS = ("unit", "cli", "hostile")


def pytest_configure(config):
    """matplotlib builds its font cache on first use by running `fc-list`: do that first use
    here, once per session, in the real (possibly empty) MPLCONFIGDIR, so tests the process
    guard keeps process-free never meet it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.font_manager  # noqa: F401 - the import builds the cache


def pytest_collection_modifyitems(config, items):
    for item in items:
        parts = item.path.parts
        if "e2e" in parts:
            item.add_marker(pytest.mark.process)
        if item.path.name == "test_packaging.py":
            item.add_marker(pytest.mark.packaging)
            item.add_marker(pytest.mark.process)


def _refuse(*args, **kwargs):
    raise AssertionError(
        "this test started a process: mark it @pytest.mark.process (or keep it process-free)"
    )


@pytest.fixture(autouse=True)
def _process_free_unless_marked(request, monkeypatch):
    """Hold the tiers honest: an unmarked unit or cli test that forks or spawns fails."""
    tests_dir = request.path.parts[request.path.parts.index("tests") + 1 :]
    if tests_dir[:1] and tests_dir[0] in _PROCESS_FREE_DIRS:
        if request.node.get_closest_marker("process") is None:
            import multiprocessing.util
            import os
            import subprocess

            monkeypatch.setattr(os, "fork", _refuse)
            monkeypatch.setattr(subprocess.Popen, "_execute_child", _refuse)
            monkeypatch.setattr(multiprocessing.util, "spawnv_passfds", _refuse)
    yield


@contextlib.contextmanager
def tiny_tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` (`4m`, `64k`) mounted at `where` for the block and unmounted after: a
    disk that fills. The test is skipped where mount is refused (not root) or missing."""
    where.mkdir(exist_ok=True)
    if shutil.which("mount") is None:
        pytest.skip("cannot mount a tmpfs here (no mount)")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or 'not root'})")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)
