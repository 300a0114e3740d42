"""Fixtures for triage tests: a reaper check that no rank process outlives a test."""

from __future__ import annotations

import psutil
import pytest


@pytest.fixture
def no_leftovers():
    """Fails the test if any child process of this pytest survives it (py-spy or a fake rank)."""
    yield
    children = psutil.Process().children(recursive=True)
    _, alive = psutil.wait_procs(children, timeout=5)
    assert not alive, f"processes left behind: {[p.pid for p in alive]}"
