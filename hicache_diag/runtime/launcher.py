"""Spawn and reap the pp x tp rank processes (ours; SGLang's launch_server does the same job).

The launcher owns a TCPStore on a free loopback port (port 0: the kernel picks, so parallel runs
never collide) and starts each rank as `python -m hicache_diag.harness.rank_main`. Every exit
path ends in `kill_all()`; ranks also die with the launcher through PR_SET_PDEATHSIG.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import IO, Any

import torch.distributed as dist

from hicache_diag.runtime.server_args import ServerArgs


@dataclass(eq=False)
class RankProcess:
    rank: int
    pp: int
    tp: int
    popen: subprocess.Popen
    log: IO[Any]
    state: str = "running"  # running|exited|crashed|killed|hung
    exitcode: int | None = None
    signal: int | None = None
    ended_at: float | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "pp": self.pp,
            "tp": self.tp,
            "pid": self.pid,
            "exitcode": self.exitcode,
            "signal": self.signal,
            "state": self.state,
            "ended_at": self.ended_at,
        }


@dataclass(eq=False)
class Launcher:
    run_dir: Path
    server_args: ServerArgs
    procs: list[RankProcess] = field(default_factory=list)
    store: Any = None

    def start(self) -> Launcher:
        sa = self.server_args
        self.store = dist.TCPStore(
            "127.0.0.1",
            0,
            sa.world_size + 1,
            is_master=True,
            timeout=timedelta(seconds=60),
            wait_for_workers=False,
        )
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        for rank in range(sa.world_size):
            pp, tp = divmod(rank, sa.tp_size)
            log = open(self.run_dir / f"rank{rank}.log", "ab")  # noqa: SIM115
            cmd = [
                sys.executable,
                "-m",
                "hicache_diag.harness.rank_main",
                "--run-dir",
                str(self.run_dir),
                "--rank",
                str(rank),
                "--store-port",
                str(self.store.port),
            ]
            popen = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
            )
            self.procs.append(RankProcess(rank, pp, tp, popen, log))
        return self

    def poll(self) -> list[RankProcess]:
        """Ranks that ended since the last poll, earliest first. Ranks that end within one poll
        are ordered by when their log last changed: a rank that died (or raised) writes its last
        line before the peers that fail in its wake write theirs."""
        ended = [p for p in self.procs if p.state == "running" and p.popen.poll() is not None]
        ended.sort(key=self._log_mtime)
        for p in ended:
            rc = p.popen.returncode
            self._mark_ended(p, rc, "exited" if rc == 0 else "crashed")
        return ended

    def _log_mtime(self, p: RankProcess) -> int:
        try:
            return (self.run_dir / f"rank{p.rank}.log").stat().st_mtime_ns
        except OSError:
            return 0

    def _mark_ended(self, p: RankProcess, rc: int, state: str) -> None:
        p.exitcode, p.state, p.ended_at = rc, state, time.time()
        p.signal = -rc if rc < 0 else None
        p.log.close()

    def alive(self) -> list[RankProcess]:
        return [p for p in self.procs if p.state == "running"]

    def signal_all(self, sig: int) -> None:
        for p in self.alive():
            try:
                os.kill(p.pid, sig)
            except ProcessLookupError:
                pass

    def kill_all(self, state: str = "killed") -> None:
        """SIGKILL every live rank and wait for it; idempotent. Safe inside a finally."""
        self.poll()
        for p in self.alive():
            try:
                p.popen.kill()
            except ProcessLookupError:
                pass
        for p in self.alive():
            rc = p.popen.wait()
            self._mark_ended(p, rc, state)

    def close(self) -> None:
        self.kill_all()
        self.store = None
