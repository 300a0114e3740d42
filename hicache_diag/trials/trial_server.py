"""A warm process that forks bisect trials, so that a trial skips the interpreter start and the
torch import of its own process (ours; bench/bisect_throughput.py measures it).

Run as `python -m hicache_diag.trials.trial_server`: a fresh, single-threaded interpreter
(forking from bisect itself would copy locks its progress and pool threads may hold). Protocol,
one JSON object a line: bisect writes `{id, module, argv, log}` to the server's stdin; the
server answers `{id, pid}` when the trial started and `{id, rc}` when it ended. A trial is
`python -m MODULE ARGV` (trials/bisect_child.py: the trial function on one planned trial)
with stdout and stderr on the file `log`, in its own session, so its pid is its process group
and bisect kills it whole. The server ignores SIGINT (bisect decides what to kill); when its
stdin closes (bisect ended or died) it kills every trial still running, reaps and exits.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any, NoReturn

from hicache_diag.trials.forked_process import fork_module, preload
from hicache_diag.trials.signals import signal_group

MODULE = "hicache_diag.trials.bisect_child"  # a trial: the trial function, called in a fork
# What every trial imports; each engine adds its own (engines.py `EngineEntry.preload`).
PRELOAD = (
    "torch",
    MODULE,
    "hicache_diag.engines.registry",
    "hicache_diag.trials.trial",
    "hicache_diag.diagnosis.classify",
)
_POLL_S = 0.05  # how late a trial's end may be reported
KILL_GRACE_S = 20.0  # for a trial to reap its engine on SIGTERM before it is SIGKILLed


def _send(msg: dict[str, Any]) -> None:
    os.write(1, (json.dumps(msg) + "\n").encode())  # one line < PIPE_BUF: one atomic write


def _trial_leader(req: dict[str, Any]) -> NoReturn:
    """The forked child: a new session whose leader waits for the trial (MODULE forked once more
    by fork_module, which resets the child to a fresh interpreter's state) and exits with its
    code. Never returns into the server's loop."""
    code = 1
    try:
        os.setsid()
        log = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log, 1)  # off the server's protocol pipes
        os.dup2(log, 2)
        # The trial's launcher turns SIGINT into KeyboardInterrupt and reaps its ranks.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        trial = fork_module(req.get("module", MODULE), list(req["argv"]), log, {})
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the leader outlives its trial
        rc = trial.wait()
        code = rc if rc >= 0 else 128 - rc
    finally:
        os._exit(code)


def _start(req: dict[str, Any]) -> int:
    pid = os.fork()
    if pid == 0:
        _trial_leader(req)
    return pid


def _reap(live: dict[int, Any]) -> None:
    while live:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid in live:
            _send({"id": live.pop(pid), "rc": os.waitstatus_to_exitcode(status)})


def _kill_all(live: dict[int, Any], grace_s: float = KILL_GRACE_S) -> None:
    """SIGTERM each trial's group (a trial reaps its engine's processes on it, as on Ctrl-C:
    a SIGKILLed trial cannot, and an SGLang server's detokenizer then outlives it), wait up to
    `grace_s`, then SIGKILL what is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in list(live):
            signal_group(pid, sig)
        deadline = time.monotonic() + (grace_s if sig == signal.SIGTERM else 10.0)
        while live and time.monotonic() < deadline:
            for pid in list(live):
                try:
                    done, _ = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    done = pid
                if done:
                    live.pop(pid, None)
            time.sleep(_POLL_S)


def _requests(buf: bytes) -> tuple[list[dict[str, Any]], bytes]:
    *lines, rest = buf.split(b"\n")
    return [json.loads(line) for line in lines if line.strip()], rest


def serve(engine_modules: tuple[str, ...] = ()) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    preload((*PRELOAD, *engine_modules))  # here, in the server: the CLI must not pay for torch
    _send({"ready": os.getpid()})
    live: dict[int, Any] = {}  # trial leader pid -> request id
    buf = b""
    try:
        while True:
            if select.select([0], [], [], _POLL_S)[0]:
                chunk = os.read(0, 1 << 16)
                if not chunk:
                    break  # bisect closed our stdin: it ended, or died
                reqs, buf = _requests(buf + chunk)
                for req in reqs:
                    pid = _start(req)
                    live[pid] = req["id"]
                    _send({"id": req["id"], "pid": pid})
            _reap(live)
    finally:
        _kill_all(live)


# --- bisect's side ----------------------------------------------------------------------------


class WarmTrial:
    """A trial the server started: the part of subprocess.Popen that bisect's runner uses (its
    stdout and stderr are the file `log`)."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.pid = 0
        self.returncode: int | None = None
        self.started = threading.Event()
        self.ended = threading.Event()

    def wait(self, timeout: float | None = None) -> int:
        if not self.ended.wait(timeout):
            raise subprocess.TimeoutExpired(f"trial {self.pid}", timeout or 0.0)
        return -1 if self.returncode is None else self.returncode  # -1: the server died


class TrialServer:
    """bisect's handle on a running trial server (see the module docstring)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.ready = threading.Event()
        self._lock = threading.Lock()
        self._trials: dict[int, WarmTrial] = {}
        self._next = 0
        self.dead = False
        self._reader = threading.Thread(target=self._read, name="trial-server", daemon=True)
        self._reader.start()

    @classmethod
    def start(
        cls, log: Path, env: dict[str, str], timeout_s: float = 60.0, modules: tuple[str, ...] = ()
    ) -> TrialServer | None:
        """None when the server did not come up (bisect then starts each trial itself).
        `modules`: the trials' engines' own modules, imported once here before any fork."""
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", __name__, *modules],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env=env,
            )
        server = cls(proc)
        try:
            if server.ready.wait(timeout_s) and proc.poll() is None:
                return server
        except BaseException:
            server.close()
            raise
        server.close()
        return None

    def submit(
        self, args: list[str], log: Path, module: str = MODULE, timeout_s: float = 30.0
    ) -> WarmTrial | None:
        """Start `python -m MODULE ARGS` (a bisect_child on its plan file); None when the server
        is gone."""
        trial = WarmTrial(log)
        with self._lock:
            if self.dead:
                return None
            rid, self._next = self._next, self._next + 1
            self._trials[rid] = trial
        try:
            self._write({"id": rid, "module": module, "argv": args, "log": str(log)})
        except OSError:
            return None
        if not trial.started.wait(timeout_s) or trial.pid <= 0:
            return None
        return trial

    def _write(self, msg: dict[str, Any]) -> None:
        stdin: IO[bytes] = self.proc.stdin  # type: ignore[assignment]
        with self._lock:
            stdin.write((json.dumps(msg) + "\n").encode())
            stdin.flush()

    def _read(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            try:
                msg = json.loads(line)
            except ValueError:
                continue  # not ours (a library printing at import): the protocol is JSON
            if "ready" in msg:
                self.ready.set()
                continue
            trial = self._trials[msg["id"]]
            if "pid" in msg:
                trial.pid = msg["pid"]
                trial.started.set()
            else:
                trial.returncode = msg["rc"]
                trial.ended.set()
        with self._lock:
            self.dead = True
            trials = list(self._trials.values())
        for trial in trials:  # the server is gone: nobody will report these
            trial.started.set()
            trial.ended.set()

    def close(self, timeout_s: float = 10.0) -> None:
        """Close the server's stdin: it kills the trials still running and exits."""
        try:
            self.proc.stdin.close()  # type: ignore[union-attr]
        except OSError:
            pass
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout_s)


if __name__ == "__main__":
    serve(tuple(sys.argv[1:]))
    sys.exit(0)
