"""The builtin engine beneath the one trial loop: forked or spawned ranks of our runtime
(builtin/launcher.py) that run their own workload; the no-cache reference is computed here
while they run."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hicache_diag import evidence as ev
from hicache_diag.engines.builtin.options import BuiltinOptions
from hicache_diag.trials.engine import Engine

if TYPE_CHECKING:
    from hicache_diag.engines.builtin.launcher import LaunchedRank
    from hicache_diag.engines.builtin.runtime.server_args import RunConfig
    from hicache_diag.trials.engine import EngineConfig, Failure, Progress, TrialWatch
    from hicache_diag.trials.trial import TrialResult

POLL_S = 0.1
CASCADE_GRACE_S = 1.0  # survivors of a crash get this long to log their own error


class BuiltinEngine(Engine):
    """Our runtime beneath the one trial loop (trials/engine.py `Engine`): forked or spawned
    ranks (builtin/launcher.py) that run their own workload; the no-cache reference is computed
    here while they run."""

    poll_s = POLL_S
    faulthandler = True  # rank_main installs it on SIGUSR1
    started_at = 0.0  # set at start()
    tie_tolerance = BuiltinOptions.tie_tolerance

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.started_at = time.time()
        self.launcher: Any = None  # builtin.launcher.Launcher, made by prepare()
        self.run_dir: Path | None = None

    def prepare(self, run_dir: Path) -> None:
        from hicache_diag.engines.builtin.launcher import Launcher

        self.run_dir = run_dir
        self.launcher = Launcher(run_dir, self.cfg.server_args)

    def manifest(self, argv: list[str]) -> dict[str, Any]:
        import torch

        from hicache_diag.engines.builtin.manifest import manifest_fields

        return manifest_fields(self.cfg, argv, torch.__version__)

    def start(self) -> None:
        self.started_at = time.time()
        self.launcher.start()

    def drive(self) -> None:
        """The ranks run their own workload; the reference is computed meanwhile."""
        from hicache_diag.engines.builtin.reference import compute_reference
        from hicache_diag.options.workloads import Workload
        from hicache_diag.trials.rundir import write_json

        workload = Workload(self.cfg.workload, self.cfg.server_args)
        reference = compute_reference(self.cfg.server_args.model, workload.requests)
        write_json(self.run_dir / ev.REFERENCE, reference)

    def running(self) -> bool:
        return bool(self.launcher.alive())

    def poll(self, now: float) -> list[Failure]:
        from hicache_diag.trials.engine import Failure

        return [
            Failure(
                ev.FirstFailure(p.rank, p.ended_at, p.pid, p.exitcode, p.signal),
                CASCADE_GRACE_S,
            )
            for p in self.launcher.poll()
            if p.state == "crashed"
        ]

    def ranks(self) -> list[LaunchedRank]:
        return list(self.launcher.procs) if self.launcher is not None else []

    def alive(self) -> list[LaunchedRank]:
        return self.launcher.alive()

    def stop(self, state: str) -> None:
        self.launcher.kill_all(state)

    def close(self, watch: TrialWatch) -> None:
        if self.launcher is not None:
            self.launcher.close()


def run_builtin_trial(
    cfg: EngineConfig, argv: list[str] | None = None, on_progress: Progress | None = None
) -> TrialResult:
    """The builtin engine's trial: the one trial loop over a BuiltinEngine."""
    from hicache_diag.trials.trial import run_engine_trial

    return run_engine_trial(BuiltinEngine(cfg), cfg, argv, on_progress)
