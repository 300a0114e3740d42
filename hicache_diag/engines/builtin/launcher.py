"""Spawn and reap the pp x tp rank processes (ours; SGLang's launch_server does the same job).

The launcher owns a TCPStore on a free loopback port (port 0: the kernel picks, so parallel runs
never collide) and starts each rank running `hicache_diag.engines.builtin.rank_main`, in one of
two ways
($HICACHE_DIAG_RANK_START):
- `fork` (default): a fork of this process, which has torch imported already, so a rank skips the
  interpreter start and the torch import (most of a short trial's cost). The ranks are forked
  before the store exists (a TCPStore master runs a server thread, and threads do not survive a
  fork) and read its port from a pipe.
- `spawn`: `python -m hicache_diag.engines.builtin.rank_main`, a fresh interpreter per rank.
Either way each rank is its own process, a child of the launcher, and sets its own title,
PDEATHSIG and SIGUSR1 faulthandler. Every exit path ends in `kill_all()`; ranks also die with the
launcher through PR_SET_PDEATHSIG.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import IO, Any

import torch.distributed as dist

from hicache_diag import evidence as ev
from hicache_diag.engines.builtin.rank_main import RANK_PRELOAD
from hicache_diag.engines.builtin.runtime.server_args import ServerArgs
from hicache_diag.errors import UsageError
from hicache_diag.trials.forked_process import ForkedProcess, fork_module, preload

START_METHOD_ENV = "HICACHE_DIAG_RANK_START"
START_METHODS = ("fork", "spawn")
RANK_MODULE = "hicache_diag.engines.builtin.rank_main"


def start_method_from_env() -> str:
    method = os.environ.get(START_METHOD_ENV) or "fork"
    if method not in START_METHODS:
        raise UsageError(f"{START_METHOD_ENV}={method!r} is not one of {', '.join(START_METHODS)}")
    return method


@dataclass(eq=False)
class LaunchedRank:
    rank: int
    pp: int
    tp: int
    popen: subprocess.Popen | ForkedProcess
    log: IO[Any]
    start_method: str = "spawn"
    state: str = "running"  # running|exited|crashed|killed|hung
    exitcode: int | None = None
    signal: int | None = None
    ended_at: float | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def own_facts(self) -> dict[str, Any]:
        return {"start_method": self.start_method}


@dataclass(eq=False)
class Launcher:
    """Owns the rank processes of one run: `start()` once, then `poll()` from the watching
    thread, and `close()` on every exit path. Every rank is a direct child of this process."""

    run_dir: Path
    server_args: ServerArgs
    procs: list[LaunchedRank] = field(default_factory=list)
    store: Any = None
    start_method: str = field(default_factory=start_method_from_env)

    def __post_init__(self) -> None:
        if self.start_method not in START_METHODS:
            raise UsageError(f"start method {self.start_method!r}; valid: fork, spawn")

    def start(self) -> Launcher:
        if self.start_method == "fork":
            return self._start_forked()
        self.store = self._make_store()
        for rank in range(self.server_args.world_size):
            args = self._rank_args(rank) + ["--store-port", str(self.store.port)]
            cmd = [sys.executable, "-m", RANK_MODULE, *args]
            log = self._open_log(rank)
            env = {**os.environ, "PYTHONUNBUFFERED": "1", **self._rank_env()}
            popen = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
            )
            self._add(rank, popen, log)
        return self

    def _start_forked(self) -> Launcher:
        preload(RANK_PRELOAD)
        pipes: list[int] = []
        try:
            for rank in range(self.server_args.world_size):
                pipes.append(self._fork_rank(rank, pipes))
            self.store = self._make_store()
            for fd in pipes:
                os.write(fd, f"{self.store.port}\n".encode())
        finally:
            for fd in pipes:
                os.close(fd)
        return self

    def _fork_rank(self, rank: int, pipes: list[int]) -> int:
        """Fork one rank; return the write end of the pipe that will carry the store port."""
        read_fd, write_fd = os.pipe()
        args = self._rank_args(rank) + ["--store-fd", str(read_fd)]
        log = self._open_log(rank)
        try:
            env = self._rank_env()
            child = fork_module(RANK_MODULE, args, log.fileno(), env, [*pipes, write_fd])
        except BaseException:
            log.close()
            os.close(write_fd)
            raise
        finally:
            os.close(read_fd)
        self._add(rank, child, log)
        return write_fd

    def _make_store(self) -> Any:
        return dist.TCPStore(
            "127.0.0.1",
            0,
            self.server_args.world_size + 1,
            is_master=True,
            timeout=timedelta(seconds=60),
            wait_for_workers=False,
        )

    def _rank_args(self, rank: int) -> list[str]:
        return ["--run-dir", str(self.run_dir), "--rank", str(rank)]

    def _rank_env(self) -> dict[str, str]:
        return {
            "OMP_NUM_THREADS": "1",
            START_METHOD_ENV: self.start_method,
            "HICACHE_DIAG_LAUNCHER_PID": str(os.getpid()),
            "HICACHE_DIAG_LAUNCHED_AT": repr(time.time()),
        }

    def _open_log(self, rank: int) -> IO[Any]:
        return open(ev.rank_log(self.run_dir, rank), "ab")  # noqa: SIM115

    def _add(self, rank: int, proc: subprocess.Popen | ForkedProcess, log: IO[Any]) -> None:
        pp, tp = divmod(rank, self.server_args.tp_size)
        self.procs.append(LaunchedRank(rank, pp, tp, proc, log, self.start_method))

    def poll(self) -> list[LaunchedRank]:
        """Ranks that ended since the last poll, earliest first. Ranks that end within one poll
        are ordered by when their log last changed: a rank that died (or raised) writes its last
        line before the peers that fail in its wake write theirs."""
        ended = [p for p in self.procs if p.state == "running" and p.popen.poll() is not None]
        ended.sort(key=self._log_mtime)
        for p in ended:
            rc = p.popen.returncode
            self._mark_ended(p, rc, "exited" if rc == 0 else "crashed")
        return ended

    def _log_mtime(self, p: LaunchedRank) -> int:
        try:
            return ev.rank_log(self.run_dir, p.rank).stat().st_mtime_ns
        except OSError:
            return 0

    def _mark_ended(self, p: LaunchedRank, rc: int, state: str) -> None:
        p.exitcode, p.state, p.ended_at = rc, state, time.time()
        p.signal = -rc if rc < 0 else None
        p.log.close()

    def alive(self) -> list[LaunchedRank]:
        return [p for p in self.procs if p.state == "running"]

    def signal_all(self, sig: int) -> None:
        for p in self.alive():
            try:
                os.kill(p.pid, sig)
            except ProcessLookupError:
                pass

    def kill_all(self, state: str = "killed") -> None:
        """SIGKILL every live rank and wait for it; idempotent. Safe inside a finally. Every
        rank is stopped (SIGSTOP) before any is killed: a rank killed first would be seen going
        by a peer still running, which logs the lost connection as if a rank had crashed."""
        self.poll()
        self.signal_all(signal.SIGSTOP)
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
