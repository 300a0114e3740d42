"""Start and reap fake_recorded_rank.py processes: a recorded server's schedulers, without
SGLang; shared by the live tests and bench/triage_recorded.py. Not collected by pytest."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil

from hicache_diag.evidence import recording as rec

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]


class RecordedRanks:
    """Scheduler-titled processes recording into one session (fake_recorded_rank.py), one per
    entry of `steps`. `own_env`: each keeps /proc/PID/environ readable (SPT_NOENV, as the
    recorder's launch sets it); else setproctitle blanks it, as in a plain SGLang scheduler,
    and only the shell above each (the launcher's place) holds the session's name."""

    def __init__(
        self, session: Path, steps: tuple[int, ...], part: int, own_env: bool = True
    ) -> None:
        self.session, self.steps, self.part, self.own_env = session, steps, part, own_env
        self.procs: list[subprocess.Popen[str]] = []
        self.pids: list[int] = []

    def __enter__(self) -> RecordedRanks:
        env = dict(os.environ, **{rec.SESSION_ENV: str(self.session)})
        if self.own_env:
            env["SPT_NOENV"] = "1"
        script = str(HERE / "fake_recorded_rank.py")
        for rank, steps in enumerate(self.steps):
            cmd = [sys.executable, script, str(rank), str(steps), str(self.part)]
            if not self.own_env:  # a shell stays the parent: `; exit` keeps it from exec'ing
                cmd = ["sh", "-c", '"$@"; exit', "sh", *cmd]
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
            self.procs.append(proc)
        for proc in self.procs:
            if "READY" not in (proc.stdout.readline() if proc.stdout else ""):
                self.__exit__()
                raise RuntimeError("a fake recorded rank did not start")
        if self.own_env:
            self.pids = [p.pid for p in self.procs]
        else:
            self.pids = [psutil.Process(p.pid).children()[0].pid for p in self.procs]
        return self

    def __exit__(self, *exc: object) -> None:
        for pid in set(self.pids) - {p.pid for p in self.procs}:  # under a shell: the rank
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        for proc in self.procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
        for proc in self.procs:
            proc.wait(timeout=10)
            if proc.stdout:
                proc.stdout.close()
