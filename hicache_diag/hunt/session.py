"""One hunt from the command line's run options: check, scan the release, plan, run, save."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hicache_diag.errors import UsageError
from hicache_diag.hunt.model import HuntReport
from hicache_diag.hunt.plan import Candidate, plan_hunt
from hicache_diag.hunt.run import HuntConfig, run_hunt
from hicache_diag.options.limits import check_int
from hicache_diag.options.run_options import RunOptions

MAX_TRIALS = 1000


@dataclass(frozen=True, slots=True)
class HuntSession:
    cfg: HuntConfig
    release: str
    candidates: tuple[Candidate, ...]
    unmapped: tuple[str, ...]

    @property
    def planned_trials(self) -> int:
        """The most trials it may run (each candidate's first variant), for the progress bar."""
        most = self.cfg.trials * len(self.candidates)
        return min(most, self.cfg.budget_trials) if self.cfg.budget_trials else most

    def run(self, on_result: Callable | None = None) -> HuntReport:
        report = run_hunt(self.cfg, list(self.candidates), self.release, on_result)
        report.unmapped = list(self.unmapped)
        return report


def only_triggers(candidates: list[Candidate], names: tuple[str, ...], release: str):
    """The candidates of the triggers named (`--trigger`, in the plan's order); a name no
    trigger has, or one that covers no unaligned read of this release, is refused."""
    if not names:
        return candidates
    from hicache_diag.hunt.triggers import RULES

    known = sorted({r.trigger.name for r in RULES})
    planned = {c.trigger.name for c in candidates}
    for name in names:
        if name not in known:
            raise UsageError(f"--trigger {name!r}: no such trigger (known: {', '.join(known)})")
        if name not in planned:
            raise UsageError(f"--trigger {name!r} covers no unaligned read of {release}")
    return [c for c in candidates if c.trigger.name in names]


def plan_session(
    base: RunOptions,
    trials: int,
    budget_trials: int | None,
    budget_s: float | None,
    out: Path,
    triggers: tuple[str, ...] = (),
) -> HuntSession:
    """Every check before a trial starts, then the release's inventory and the plan."""
    from hicache_diag.engines.registry import engine
    from hicache_diag.sources.scan import scan_tree
    from hicache_diag.trials.rundir import check_writable

    check_int("--trials", trials, 1, MAX_TRIALS)
    if budget_trials is not None:
        check_int("--budget", budget_trials, 1, MAX_TRIALS * 100)
    if base.out is not None:
        raise UsageError("give --out to hunt itself (the parent of every trial's run dir)")
    check_writable(str(out))
    tree = engine(base.engine).sources(None, getattr(base, "sglang_python", None))
    inventory = scan_tree(tree)
    candidates, unmapped = plan_hunt(inventory.sources)
    release = f"{tree.engine} {tree.version}"
    candidates = only_triggers(candidates, triggers, release)
    cfg = HuntConfig(base, trials, budget_trials, budget_s, out)
    return HuntSession(cfg, release, tuple(candidates), tuple(unmapped))


def save_report(report: HuntReport, out: Path) -> Path:
    """hunt.json beside the trials' run dirs, written whole (output_paths.write_atomic)."""
    import json

    from hicache_diag.evidence.output_paths import write_atomic

    return write_atomic(
        out / "hunt.json", json.dumps(report.to_json(), indent=2, sort_keys=True) + "\n"
    )
