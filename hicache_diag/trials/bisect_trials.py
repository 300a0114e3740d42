"""Run one bisect trial as its own process group and read its verdict.json: the trial function
is called in a fork of the warm trial server (trials/trial_server.py) or a spawned
`bisect_child` process (trials/bisect_child.py); killed whole on timeout or Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from hicache_diag import evidence as ev
from hicache_diag.diagnosis.bisect_table import BisectTrial, undecided_trial
from hicache_diag.evidence.verdict import ExitCode, Outcome, Verdict, write_json_atomic
from hicache_diag.trials.bisect_child import TrialPlan
from hicache_diag.trials.engine import EngineConfig
from hicache_diag.trials.signals import signal_group
from hicache_diag.trials.trial_server import MODULE, TrialServer, WarmTrial

TRIAL = "hicache_diag.engines.registry:run_trial"  # the trial function, through the engine registry


@dataclass(slots=True)
class PlannedTrial:
    cell: int
    seed: int
    out: Path
    argv: list[str]  # the `hicache-diag run` line that reproduces it
    config: EngineConfig  # the cell's config with this trial's seed and run dir

    @property
    def log(self) -> Path:
        """The trial process's stdout and stderr (one file), beside its run dir."""
        return self.out.parent / f"{self.out.name}.log"

    @property
    def plan(self) -> Path:
        return self.out.parent / f"{self.out.name}.plan"


def _last_line(path: Path) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else ""


def read_verdict(run_dir: Path) -> Verdict | None:
    """The trial's verdict.json (written last, atomically); None when it was never written."""
    try:
        return Verdict.read(run_dir / ev.VERDICT)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def result_of(trial: PlannedTrial, rc: int, wall_s: float) -> BisectTrial:
    """The trial's result from its verdict.json (what bisect tabulates)."""
    if rc == ExitCode.BAD_INPUT:
        why = _last_line(trial.log).removeprefix("hicache-diag: error: ")
        return BisectTrial(trial.seed, str(trial.out), None, error=f"bad input: {why}")
    verdict = read_verdict(trial.out)
    if verdict is None:
        why = _last_line(trial.log) or "no verdict"
        return undecided_trial(trial.seed, str(trial.out), "no verdict", f"exit {rc}: {why}")
    if verdict.outcome in (Outcome.UNDECIDED, Outcome.INTERRUPTED):
        # Neither a pass nor a failure of the system: shown with its cause, never counted.
        why = f"{verdict.outcome.value}: {verdict.signature}"
        cause = verdict.outcome.value
        if (verdict.signature or "").startswith("step budget"):
            cause = "step budget"  # the run's own --max-steps: a limit of the tool's
        return undecided_trial(trial.seed, str(trial.out), cause, why)
    form = verdict.form.value if verdict.form else None
    duration = float(verdict.duration_s or wall_s)
    return BisectTrial(trial.seed, str(trial.out), verdict.outcome.value, form, duration)


def timed_out(trial: PlannedTrial, timeout_s: float) -> BisectTrial:
    """A trial bisect stopped at --trial-timeout decided nothing, whatever it had written: its
    run dir's verdict.json says so (undecided, the cause), replacing an `interrupted` one (our
    SIGINT, not a user's) or none at all, so the trial's own record never reads as a result."""
    cause = f"trial timeout {timeout_s:g}s"
    why = f"timed out after {timeout_s:g}s (--trial-timeout): stopped before its verdict"
    before = read_verdict(trial.out)
    evidence = [why, "raise --trial-timeout to let the trial finish; nothing here is a verdict"]
    if before is not None:
        evidence.append(f"the trial's own record when stopped: {before.outcome.value}")
    verdict = Verdict(
        Outcome.UNDECIDED,
        signature=why,
        evidence=evidence,
        seed=trial.seed,
        duration_s=timeout_s,
        run_dir=str(trial.out),
    )
    write_json_atomic(trial.out / ev.VERDICT, verdict.to_json())
    return undecided_trial(trial.seed, str(trial.out), cause, why)


Trial = subprocess.Popen | WarmTrial


def kill_group(proc: Trial) -> None:
    """SIGINT the trial's group (the launcher reaps its ranks), then SIGKILL what is left."""
    try:
        import psutil

        kids = psutil.Process(proc.pid).children(recursive=True)
    except Exception:  # noqa: BLE001 - already gone
        kids = []
    for sig, grace in ((signal.SIGINT, 3.0), (signal.SIGKILL, 2.0)):
        if not signal_group(proc.pid, sig):
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
    """Runs trials (forked by the warm server, else spawned) and keeps their handles so they can
    all be killed at once. `trial_fn`: the trial function each trial process calls."""

    def __init__(
        self, timeout_s: float, server: TrialServer | None = None, trial_fn: str = TRIAL
    ) -> None:
        self.timeout_s = timeout_s
        self.trial_fn = trial_fn
        self.server = server
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._procs: dict[int, Trial] = {}

    def _launch(self, trial: PlannedTrial) -> Trial:
        TrialPlan(self.trial_fn, trial.config, tuple(trial.argv)).save(trial.plan)
        if self.server is not None:
            warm = self.server.submit([str(trial.plan)], trial.log)
            if warm is not None:
                return warm
        with open(trial.log, "wb") as log:
            return subprocess.Popen(
                [sys.executable, "-m", MODULE, str(trial.plan)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=trial_env(),
            )

    def _start(self, trial: PlannedTrial) -> Trial | None:
        trial.out.parent.mkdir(parents=True, exist_ok=True)
        with self._lock:
            if self.stopping.is_set():
                return None
            proc = self._launch(trial)
            self._procs[proc.pid] = proc
        return proc

    def run(self, trial: PlannedTrial) -> BisectTrial | None:
        start = time.monotonic()
        proc = self._start(trial)
        if proc is None:
            return None
        try:
            rc = proc.wait(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            proc.wait()
            return timed_out(trial, self.timeout_s)
        finally:
            with self._lock:
                self._procs.pop(proc.pid, None)
            trial.plan.unlink(missing_ok=True)
        if self.stopping.is_set():
            return None  # killed by Ctrl-C: not a trial outcome
        return result_of(trial, rc, time.monotonic() - start)

    def kill_all(self) -> None:
        with self._lock:
            self.stopping.set()
            procs = list(self._procs.values())
        for proc in procs:
            kill_group(proc)
