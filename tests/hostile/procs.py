"""The CLI as a real process for the hostile suite's slow tier: a marker in its environment
finds every process it (and its ranks and trials) started, so "no process left" holds even for
orphans a killed CLI left to init; and signals sent at a seeded point of its run."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psutil

from tests.conftest import assert_gone
from tests.hostile.invariants import Ran

CLI = [sys.executable, "-m", "hicache_diag.cli.main"]
MARK = "I41_HOSTILE_MARK"  # not HICACHE_DIAG_*: the tool warns about names it does not read


def marked(mark: str) -> list[psutil.Process]:
    """Every live process whose environment carries `mark`."""
    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.environ().get(MARK) == mark and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.Error, OSError):
            continue
    return found


def assert_none_left(mark: str, grace_s: float = 10.0) -> None:
    """Every process carrying `mark`, gone within `grace_s` (tests/conftest.py's assert_gone)."""
    assert_gone(lambda: marked(mark), grace_s, 0.2, "left running")


class Cli:
    """One CLI process, started with a fresh mark."""

    def __init__(
        self,
        argv: list[str],
        cwd: Path,
        env: dict[str, str] | None = None,
        preexec: Callable[[], None] | None = None,
    ) -> None:
        self.mark = uuid.uuid4().hex
        full_env = dict(os.environ, **(env or {}), **{MARK: self.mark})
        full_env.pop("COLUMNS", None)
        self.proc = subprocess.Popen(
            [*CLI, *map(str, argv)],
            cwd=cwd,
            env=full_env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=preexec,
        )
        self.started = time.time()

    def signal_at(self, sig: int, after_s: float) -> None:
        """`sig` `after_s` seconds from the start (at once if that has passed)."""
        time.sleep(max(0.0, self.started + after_s - time.time()))
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def wait(self, timeout_s: float = 240.0) -> Ran:
        try:
            out, err = self.proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
            raise AssertionError(f"did not end within {timeout_s} s: {err[-2000:]}") from None
        return Ran(self.proc.returncode, out, err)


def seeded_delay(seed: int, low: float, high: float) -> float:
    """The replayable point of a case: its seed (in the test id) gives the same delay."""
    return random.Random(seed).uniform(low, high)


SIGNALS = {"INT": signal.SIGINT, "TERM": signal.SIGTERM, "HUP": signal.SIGHUP}
