"""`bisect --via slurm`: every trial a Slurm job step (`srun -N1 -n1`; inside an allocation a
step of it, else a one-step job of its own), its run dir on the shared path bisect reads.

Hooks in as bisect's trial function (BisectConfig.trial, "module:function"): the local trial
process (harness/bisect_child.py) calls `run_trial`, which hands the same plan with the real
trial function to `srun ... python -m hicache_diag.harness.bisect_child PLAN` and returns the
verdict the step wrote. A step that ends without a verdict (lost node, cancelled, killed) is an
error of the trial, listed with the errors, never a pass. Needs this interpreter and the `--out`
folder at the same paths on the compute nodes (a shared filesystem)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from hicache_diag.errors import HicacheDiagError, UsageError

TRIAL = "hicache_diag.cluster.slurm_trials:run_trial"
REAL_TRIAL = "hicache_diag.engines:run_trial"  # harness/bisect_trials.py's TRIAL


def via(cfg: Any, executor: str) -> Any:
    """The bisect config with its trials sent through `executor` (slurm only, for now)."""
    if executor != "slurm":
        raise UsageError(f"bisect --via {executor!r}: only slurm runs trials remotely so far")
    if shutil.which("srun") is None:
        raise UsageError("bisect --via slurm: srun not found (run on a Slurm login node)")
    return replace(cfg, trial=TRIAL)


def step_argv(plan: Path) -> list[str]:
    module = "hicache_diag.harness.bisect_child"
    step = ["srun", "-N1", "-n1", "--quiet", "--job-name=hicache-diag-trial", "--kill-on-bad-exit"]
    return [*step, sys.executable, "-m", module, str(plan)]


def run_trial(config: Any, argv: list[str]) -> Any:
    from hicache_diag.harness.bisect_child import TrialPlan
    from hicache_diag.harness.bisect_trials import read_verdict
    from hicache_diag.harness.trial import TrialResult

    out = Path(str(config.out))
    plan = out.parent / f"{out.name}.slurm.plan"
    TrialPlan(REAL_TRIAL, config, tuple(argv)).save(plan)
    try:
        # Our stdout/stderr are the trial's log; srun forwards the step's there.
        rc = subprocess.run(step_argv(plan), stdin=subprocess.DEVNULL).returncode
    finally:
        plan.unlink(missing_ok=True)
    verdict = read_verdict(out)
    if verdict is None:
        raise HicacheDiagError(f"the slurm step ended without a verdict (srun exit {rc})")
    return TrialResult(verdict, out)
