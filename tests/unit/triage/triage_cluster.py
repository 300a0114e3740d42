"""Start and reap a fake_cluster.py run; shared by the live tests and bench/triage.py."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = Path(__file__).with_name("fake_cluster.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeCluster:
    """`world` real rank processes in one scenario; a context manager that always reaps them."""

    def __init__(self, scenario: str, world: int, tp: int = 1, settle_s: float = 0.5) -> None:
        self.scenario, self.world, self.tp, self.settle_s = scenario, world, tp, settle_s
        self.procs: list[subprocess.Popen[str]] = []

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def __enter__(self) -> FakeCluster:
        port = str(free_port())
        for rank in range(self.world):
            cmd = [sys.executable, str(SCRIPT), self.scenario, str(rank), str(self.world), port]
            self.procs.append(
                subprocess.Popen(cmd + [str(self.tp)], stdout=subprocess.PIPE, text=True)
            )
        try:
            self._wait_ready(timeout=60.0)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        time.sleep(self.settle_s)  # READY is printed just before the rank parks
        return self

    def _wait_ready(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        for proc in self.procs:
            line = proc.stdout.readline() if proc.stdout else ""
            if "READY" not in line or time.monotonic() > end:
                raise RuntimeError(f"fake rank {proc.pid} did not start: {line!r}")

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs:
            proc.wait(timeout=10)
            if proc.stdout:
                proc.stdout.close()
