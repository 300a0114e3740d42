"""The hostile suite's fixtures: the CLI in this process (fast tier) with a deadline, so a
read that blocks (a FIFO) fails the case instead of hanging the suite."""

from __future__ import annotations

import signal
from collections.abc import Callable

import pytest

from hicache_diag.cli.main import run_cli
from tests.hostile.invariants import Ran

DEADLINE_S = 60


class Deadline(Exception):
    pass


def _alarm(signum, frame):
    raise Deadline(f"the command did not end within {DEADLINE_S} s (a blocking read?)")


@pytest.fixture
def cli(capsys, monkeypatch) -> Callable[[list[str]], Ran]:
    """`cli(argv)`: the CLI in-process under a deadline; its exit code, stdout, stderr."""
    monkeypatch.setenv("COLUMNS", "120")

    def call(argv: list[str]) -> Ran:
        capsys.readouterr()
        old = signal.signal(signal.SIGALRM, _alarm)
        signal.alarm(DEADLINE_S)
        try:
            code = run_cli([str(a) for a in argv])
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)
        got = capsys.readouterr()
        return Ran(code, got.out, got.err)

    return call


@pytest.fixture
def no_export_probe(monkeypatch):
    """export without probing an SGLang interpreter (a process): the cases here are about
    what it reads and writes, not the release's source."""
    from hicache_diag.export import export

    monkeypatch.setattr(export, "run_release", lambda version, python: None)
    monkeypatch.setattr(export, "releases", dict)
