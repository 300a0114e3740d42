"""`run --check` for a scenario that states a rate: its trials run as bisect runs them (each in
its own process and run dir, seed + j, a trial timeout of the engine's), each judged against the
scenario's [expect], then the rate judged by the Wilson interval of the trials that matched
(faults/expect.py `judge_rate`). A trial without a verdict, or an undecided one, is counted
apart: it neither matches nor refutes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hicache_diag.diagnosis.stats import wilson
from hicache_diag.evidence.verdict import ExitCode, Outcome
from hicache_diag.trials.trials import run_trials, trial_verdict

if TYPE_CHECKING:
    from hicache_diag.diagnosis.bisect_table import BisectTrial, Cell
    from hicache_diag.faults.expect import Expectation
    from hicache_diag.trials.engine import EngineConfig
    from hicache_diag.trials.warm_trials import WarmPool

_NOT_DECIDED = (Outcome.UNDECIDED, Outcome.INTERRUPTED)


@dataclass(frozen=True, slots=True)
class CheckedTrial:
    """One trial against [expect]: `matched` None when the trial decided nothing."""

    seed: int
    run_dir: str
    outcome: str | None
    form: str | None
    matched: bool | None
    why: tuple[str, ...] = ()  # its mismatch lines, or why it decided nothing

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "run_dir": self.run_dir,
            "outcome": self.outcome,
            "form": self.form,
            "matched": self.matched,
            "why": list(self.why),
        }


@dataclass(frozen=True, slots=True)
class RateCheck:
    expect: str
    trials: tuple[CheckedTrial, ...]
    interval: tuple[float, float]
    mismatches: tuple[str, ...]
    interrupted: bool = False

    @property
    def matched(self) -> int:
        return sum(1 for t in self.trials if t.matched)

    @property
    def decided(self) -> int:
        return sum(1 for t in self.trials if t.matched is not None)

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return int(ExitCode.INTERRUPTED)
        if not self.decided:
            return int(ExitCode.UNDECIDED)
        return int(ExitCode.CHECK_MISMATCH if self.mismatches else ExitCode.OK)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": "hicache-diag/rate-check/v1",
            "expect": self.expect,
            "matched": self.matched,
            "decided": self.decided,
            "interval": list(self.interval),
            "mismatches": list(self.mismatches),
            "interrupted": self.interrupted,
            "trials": [t.to_json() for t in self.trials],
        }


def _checked(res: BisectTrial, expect: Expectation) -> CheckedTrial:
    verdict = trial_verdict(res)
    if verdict is None:
        why = res.error or "no verdict.json"
        return CheckedTrial(res.seed, res.run_dir, res.outcome, res.form, None, (why,))
    form = verdict.form.value if verdict.form else None
    if verdict.outcome in _NOT_DECIDED:
        why = (f"{verdict.outcome.value}: {verdict.signature}",)
        return CheckedTrial(res.seed, res.run_dir, verdict.outcome.value, form, None, why)
    lines = tuple(expect.mismatches(verdict))
    return CheckedTrial(res.seed, res.run_dir, verdict.outcome.value, form, not lines, lines)


def run_rate_check(
    cfg: EngineConfig,
    expect: Expectation,
    out: Path,
    trial_timeout_s: float,
    on_result: Callable[[Cell, BisectTrial], None] | None = None,
    preload: tuple[str, ...] = (),
    warm: Callable[[Path], WarmPool] | None = None,
) -> RateCheck:
    """`expect.trials` trials of `cfg` (seeds cfg.seed + j) under `out`, judged; with `warm`
    (`--warm-server`: the engine's warm pool factory) one after another on a warm server."""
    runs, interrupted = run_trials(
        cfg, expect.trials, cfg.seed, out, trial_timeout_s, on_result, preload, warm
    )
    trials = tuple(_checked(r, expect) for r in runs)
    matched = sum(1 for t in trials if t.matched)
    decided = sum(1 for t in trials if t.matched is not None)
    interval = wilson(matched, decided)
    lines = tuple(expect.judge_rate(matched, decided, interval)) if decided else ()
    return RateCheck(expect.describe(), trials, interval, lines, interrupted)
