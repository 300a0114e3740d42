"""Trials on a warm server (`--warm-server`): a cell's trials one after another in this process,
each in its own run dir with its seed as bisect lays them out, through the engine's warm pool
(engines.py `EngineEntry.warm`: sglang/warm.py), which reuses its server only when every rank
proved it clean and says so in each trial's manifest. The trial timeout is a timer that
interrupts the trial (its server is then restarted, as after any failure)."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from hicache_diag.evidence.verdict import Outcome
from hicache_diag.trials.bisect_trials import PlannedTrial, result_of, timed_out

if TYPE_CHECKING:
    from hicache_diag.diagnosis.bisect_table import BisectTrial, Cell

OnResult = Callable[["Cell", "BisectTrial"], None]


class WarmPool(Protocol):
    """An engine's warm server: `trial(cfg, argv)` runs one trial (trials/trial.py's result)
    on it, or on a fresh one when it cannot be proven clean; `close()` stops it."""

    def trial(self, cfg: Any, argv: list[str] | None = None) -> Any: ...

    def close(self) -> None: ...


class _Deadline(KeyboardInterrupt):
    """The trial timeout: the trial loop reaps on it as on Ctrl-C."""


class _Timer:
    def __init__(self, seconds: float) -> None:
        self.seconds, self.fired = seconds, False

    def _fire(self, signum: int, frame: Any) -> None:
        self.fired = True
        raise _Deadline

    def __enter__(self) -> _Timer:
        self._old = signal.signal(signal.SIGALRM, self._fire)
        signal.setitimer(signal.ITIMER_REAL, self.seconds)
        return self

    def __exit__(self, *exc: object) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self._old)


def run_warm_cells(
    warm: Callable[[Path], WarmPool],
    where: tuple[Path, float],
    cells: list[Cell],
    planned: list[PlannedTrial],
    on_result: Any,
) -> bool:
    """Each cell's trials one after another on that cell's own warm pool (`warm(dir)`, under
    `where` = (bisect's out, the trial timeout)), the cells one after another; True when Ctrl-C
    cut them short. Every pool is closed here."""
    out, timeout_s = where
    for index, cell in enumerate(cells):
        pool = warm(out / f"warm-server-cell{index}")
        try:
            for trial in (t for t in planned if t.cell == index):
                res = _one(pool, trial, timeout_s)
                if res is None:
                    return True
                cell.results.append(res)
                if on_result is not None:
                    on_result(cell, res)
        finally:
            pool.close()
    return False


def _one(pool: WarmPool, planned: PlannedTrial, timeout_s: float) -> BisectTrial | None:
    """The trial's result; None when the user interrupted it."""
    planned.out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    result = None
    try:
        with _Timer(timeout_s) as timer:
            result = pool.trial(planned.config, list(planned.argv))
    except KeyboardInterrupt:  # outside the trial loop's own handling: its server is unknown
        pool.close()  # stopped; the next trial starts a fresh one
    if timer.fired:
        return timed_out(planned, timeout_s)
    if result is None or result.verdict.outcome is Outcome.INTERRUPTED:
        return None
    return result_of(planned, int(result.verdict.exit_code), time.monotonic() - t0)
