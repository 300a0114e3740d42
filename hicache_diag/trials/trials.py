"""N trials of one engine config, as bisect runs them (each in its own process group and run
dir, seeds `seed + j`, the engine's trial timeout): the unit the rate check, the hunt and the
shrinker repeat."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from hicache_diag import evidence as ev
from hicache_diag.evidence.verdict import Verdict
from hicache_diag.trials.bisect import BisectConfig, run_bisect

if TYPE_CHECKING:
    from hicache_diag.diagnosis.bisect_table import BisectTrial, Cell
    from hicache_diag.trials.engine import EngineConfig
    from hicache_diag.trials.warm_trials import WarmPool

OnResult = Callable[["Cell", "BisectTrial"], None]


def run_trials(
    cfg: EngineConfig,
    trials: int,
    seed: int,
    out: Path,
    trial_timeout_s: float,
    on_result: OnResult | None = None,
    preload: tuple[str, ...] = (),
    warm: Callable[[Path], WarmPool] | None = None,
) -> tuple[list[BisectTrial], bool]:
    """(each trial's result in order, whether Ctrl-C cut them short); `preload`: the engine's
    modules for the warm trial server (engines.py `EngineEntry.preload`); `warm`: the engine's
    warm pool factory (`--warm-server`): the trials then run one after another on its server."""
    plan = BisectConfig(
        (), trials, 1, seed, out, (), trial_timeout_s, (cfg,), preload=preload, warm=warm
    )
    table = run_bisect(plan, on_result)
    return table.cells[0].results, table.interrupted


def verdict_in(run_dir: str | Path) -> Verdict | None:
    """A run dir's verdict (its one reader, `Verdict.read`), or None when it left none."""
    try:
        return Verdict.read(Path(run_dir) / ev.VERDICT)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def trial_verdict(result: BisectTrial) -> Verdict | None:
    return verdict_in(result.run_dir)
