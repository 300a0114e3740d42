"""Run one bisect trial as its own process group and read its verdict: forked by the warm trial
server (harness/trial_server.py) or started as a `run` subprocess; killed whole on timeout or
Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from hicache_diag.diagnosis.bisect_table import TrialResult
from hicache_diag.harness.trial_server import TrialServer, WarmTrial
from hicache_diag.verdict import ExitCode

RUN_COMMAND = (sys.executable, "-m", "hicache_diag.cli.main", "run")


@dataclass(slots=True)
class PlannedTrial:
    cell: int
    seed: int
    out: Path
    argv: list[str]


def _last_line(text: str) -> str:
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else ""


def _read_verdict(stdout: str, out: Path) -> dict | None:
    for line in reversed((stdout or "").strip().splitlines()):
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict) and "outcome" in data:
            return data
    try:
        return json.loads((out / "verdict.json").read_text())
    except (OSError, ValueError):
        return None


def _result(trial: PlannedTrial, rc: int, stdout: str, stderr: str, wall_s: float) -> TrialResult:
    if rc == ExitCode.BAD_INPUT:
        return TrialResult(
            trial.seed, str(trial.out), None, error=f"bad input: {_last_line(stderr)}"
        )
    verdict = _read_verdict(stdout, trial.out)
    if verdict is None:
        why = _last_line(stderr) or "no verdict"
        return TrialResult(trial.seed, str(trial.out), None, error=f"exit {rc}: {why}")
    if verdict.get("outcome") in ("undecided", "interrupted"):
        # Neither a pass nor a failure of the system: listed with the errors, not counted.
        why = f"{verdict['outcome']}: {verdict.get('signature')}"
        return TrialResult(trial.seed, str(trial.out), None, error=why)
    return TrialResult(
        trial.seed,
        str(trial.out),
        str(verdict.get("outcome")),
        verdict.get("form"),
        float(verdict.get("duration_s") or wall_s),
    )


Trial = subprocess.Popen | WarmTrial


def kill_group(proc: Trial) -> None:
    """SIGINT the trial's group (the launcher reaps its ranks), then SIGKILL what is left."""
    try:
        import psutil

        kids = psutil.Process(proc.pid).children(recursive=True)
    except Exception:  # noqa: BLE001 - already gone
        kids = []
    for sig, grace in ((signal.SIGINT, 3.0), (signal.SIGKILL, 2.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            break
        try:
            proc.wait(timeout=grace)
            break
        except subprocess.TimeoutExpired:
            continue
    for kid in kids:  # ranks that left the group (their own session) must not outlive us
        try:
            kid.kill()
        except Exception:  # noqa: BLE001 - gone already
            pass


def trial_env() -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")


class TrialRunner:
    """Runs trials (forked by the warm server, else subprocesses) and keeps their handles so
    they can all be killed at once."""

    def __init__(self, timeout_s: float, server: TrialServer | None = None) -> None:
        self.timeout_s = timeout_s
        self.server = server
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._procs: dict[int, Trial] = {}

    def _launch(self, trial: PlannedTrial) -> Trial:
        if self.server is not None:
            log = trial.out.parent / f"{trial.out.name}.log"
            warm = self.server.submit(trial.argv[len(RUN_COMMAND) - 1 :], log)
            if warm is not None:
                return warm
        return subprocess.Popen(
            trial.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True, env=trial_env(),
        )  # fmt: skip

    def _start(self, trial: PlannedTrial) -> Trial | None:
        trial.out.parent.mkdir(parents=True, exist_ok=True)
        with self._lock:
            if self.stopping.is_set():
                return None
            proc = self._launch(trial)
            self._procs[proc.pid] = proc
        return proc

    def run(self, trial: PlannedTrial) -> TrialResult | None:
        start = time.monotonic()
        proc = self._start(trial)
        if proc is None:
            return None
        try:
            stdout, stderr = proc.communicate(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            proc.communicate()
            why = f"timed out after {self.timeout_s:g}s"
            return TrialResult(trial.seed, str(trial.out), None, error=why)
        finally:
            with self._lock:
                self._procs.pop(proc.pid, None)
        if self.stopping.is_set():
            return None  # killed by Ctrl-C: not a trial outcome
        return _result(trial, proc.returncode, stdout, stderr, time.monotonic() - start)

    def kill_all(self) -> None:
        with self._lock:
            self.stopping.set()
            procs = list(self._procs.values())
        for proc in procs:
            kill_group(proc)
