"""One bisect trial's own process, `python -m hicache_diag.trials.bisect_child PLAN` (forked by
the warm trial server, trials/trial_server.py, or spawned): load the planned trial, call the
trial function with its engine config and exit with the verdict's exit code. What bisect reads
is the verdict.json the trial loop writes last, nothing this process prints."""

from __future__ import annotations

import importlib
import pickle
import sys
from dataclasses import dataclass
from pathlib import Path

from hicache_diag.errors import HicacheDiagError, UsageError
from hicache_diag.evidence.verdict import ExitCode
from hicache_diag.trials.engine import EngineConfig


@dataclass(frozen=True, slots=True)
class TrialPlan:
    """`trial`: "module:function", called as function(config, argv) -> harness.trial.TrialResult
    (engines.run_trial; tests substitute a stand-in). `config`: the cell's engine config with
    this trial's seed and run dir. `argv`: the `hicache-diag run` line that reproduces the trial
    (the manifest records it)."""

    trial: str
    config: EngineConfig
    argv: tuple[str, ...]

    def save(self, path: Path) -> None:
        path.write_bytes(pickle.dumps(self))

    @staticmethod
    def load(path: Path) -> TrialPlan:
        # Our own file, written by the bisect that started this process a moment ago.
        return pickle.loads(path.read_bytes())  # noqa: S301


def main(path: str) -> int:
    try:
        plan = TrialPlan.load(Path(path))
        module, attr = plan.trial.split(":")
        result = getattr(importlib.import_module(module), attr)(plan.config, list(plan.argv))
    except UsageError as exc:  # bisect turns this into its own one-line exit 2
        return _fail(str(exc), ExitCode.BAD_INPUT)
    except HicacheDiagError as exc:
        return _fail(str(exc), ExitCode.INTERNAL_ERROR)
    return int(result.verdict.exit_code)


def _fail(message: str, code: ExitCode) -> int:
    sys.stderr.write(f"hicache-diag: error: {message}\n")
    return int(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
