"""Running the hunt: each candidate's variants in order (natural first), N trials each as bisect
runs them (own process, run dir and seed), until one diverges; a divergence is confirmed by a
fresh rerun of its seed and exported. A budget in trials or seconds stops it with a partial
report, and so does Ctrl-C."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hicache_diag.diagnosis.stats import wilson
from hicache_diag.errors import UsageError
from hicache_diag.evidence.verdict import Outcome, Verdict
from hicache_diag.hunt.model import HuntReport, TriggerResult
from hicache_diag.options.run_options import RunOptions
from hicache_diag.trials.trials import run_trials, trial_verdict, verdict_in

if TYPE_CHECKING:
    from hicache_diag.diagnosis.bisect_table import BisectTrial, Cell
    from hicache_diag.hunt.plan import Candidate
    from hicache_diag.hunt.triggers import Variant

_NOT_DECIDED = (Outcome.UNDECIDED, Outcome.INTERRUPTED)
CONFIRM_TRIES = 3  # fresh reruns of a failing seed, until one fails again
SHRINK_BUDGET = 8  # trials a hunt spends shrinking a perturbation's failure before its export


@dataclass(frozen=True, slots=True)
class HuntConfig:
    base: RunOptions  # the pass-through run options every trial starts from
    trials: int = 3  # per variant
    budget_trials: int | None = None
    budget_s: float | None = None
    out: Path = Path("runs/hunt")


class _Budget:
    def __init__(self, cfg: HuntConfig) -> None:
        self.cfg, self.used, self.t0 = cfg, 0, time.monotonic()

    def _room(self, cap: int) -> int:
        """Trials that may still start, at most `cap` (0: the time or trial budget is spent)."""
        if self.cfg.budget_s is not None and time.monotonic() - self.t0 >= self.cfg.budget_s:
            return 0
        if self.cfg.budget_trials is None:
            return cap
        return max(0, min(cap, self.cfg.budget_trials - self.used))

    def left(self) -> int:
        """Trials the next variant may run."""
        return self._room(self.cfg.trials)

    def spare(self) -> int:
        """Trials a shrink may take (the clock still stops the hunt before its next variant)."""
        return self._room(SHRINK_BUDGET)


def variant_options(base: RunOptions, variant: Variant) -> RunOptions:
    """`base` with the variant's options and fault (UsageError: the engine cannot take it)."""
    options = base
    for name, value in variant.flags.items():
        values = value if isinstance(value, list) else [value]
        for one in values:
            options = options.with_value(name, str(one), f"hunt trigger --{name}")
    if variant.fault is not None:
        options = options.with_value("faults", variant.fault, "hunt trigger --fault")
    return options


def _trials(
    cell: Any, n: int, seed: int, out: Path, on_result: Callable | None, fresh: bool = False
):
    """`n` trials of the cell; on a warm server (`--warm-server`) unless `fresh`."""
    from hicache_diag.engines.registry import engine

    entry = engine(cell.options.engine)
    timeout, preload = type(cell.options).trial_timeout_s, entry.preload
    use_warm = not fresh and getattr(cell.options, "warm_server", False)
    warm = entry.warm if use_warm else None
    return run_trials(cell.cfg, n, seed, out, timeout, on_result, preload, warm)


@dataclass(frozen=True, slots=True)
class _Cell:
    options: RunOptions
    cfg: Any  # the engine's config


def first_divergence_of(verdict: Verdict) -> dict[str, Any] | None:
    """What hunt.json records of a failing run's verdict (also when a saved hunt is re-judged,
    hunt/rejudge.py): its first divergence as the verdict writes it."""
    return verdict.to_json().get("first_divergence")


def _tally(result: TriggerResult, runs: list[BisectTrial]) -> None:
    for res in runs:
        verdict = trial_verdict(res)
        if verdict is None or verdict.outcome in _NOT_DECIDED:
            result.undecided += 1
            continue
        result.trials += 1
        if verdict.outcome is Outcome.OK:
            continue
        result.failures += 1
        form = verdict.form.value if verdict.form else verdict.outcome.value
        result.forms[form] = result.forms.get(form, 0) + 1
        if result.first_failure is None:
            result.first_failure = res.run_dir
            result.first_divergence = first_divergence_of(verdict)
    result.interval = wilson(result.failures, result.trials)


def _export(run_dir: str, out: Path) -> str:
    from hicache_diag.errors import HicacheDiagError
    from hicache_diag.export.export import export_run

    try:
        return str(export_run(Path(run_dir), out).out)
    except (HicacheDiagError, OSError) as exc:
        return f"no export: {exc}"


def _first_seed(result: TriggerResult) -> int:
    from hicache_diag.trials.rundir import read_manifest

    return int(read_manifest(Path(result.first_failure)).seed or 0)


def _confirm(result: TriggerResult, cell: _Cell, out: Path) -> bool | None:
    """Fresh reruns of the first failing seed, up to CONFIRM_TRIES, until one fails again: True
    then; False when every decided rerun passed; None when the environment left every rerun
    undecided (a rerun that never ran confirms nothing and refutes nothing). A natural
    divergence is timing, not the seed: one passing rerun does not refute it (measured: the
    0.5.23 session reap failed 4 of 4 trials and passed the first rerun of its seed)."""
    passed = False
    for attempt in range(CONFIRM_TRIES):
        where = out / "confirm" / (f"try{attempt}" if attempt else "")
        runs, interrupted = _trials(cell, 1, _first_seed(result), where, None)
        if interrupted:
            raise KeyboardInterrupt
        verdict = trial_verdict(runs[0]) if runs else None
        result.reruns.append(verdict.outcome.value if verdict is not None else "no verdict")
        if verdict is None or verdict.outcome in _NOT_DECIDED:
            continue
        if verdict.outcome is not Outcome.OK:
            return True
        passed = True
    return False if passed else None


def _shrunk(result: TriggerResult, cell: _Cell, out: Path, budget: _Budget) -> str:
    """The run to export: for a perturbation, the last failing trial of a shrink of the first
    failure (fewer faults, requests and steps for a maintainer to read); else the failure."""
    from hicache_diag.shrink.shrink import KeptFailure, shrink_run

    first = str(result.first_failure)
    verdict = verdict_in(first)
    trials = min(SHRINK_BUDGET, budget.spare())
    if result.natural or verdict is None or trials < 1:
        return first
    target = KeptFailure(verdict.outcome.value, verdict.form.value if verdict.form else None)
    report = shrink_run(cell.options, target, first, out / "shrink", 1, trials)
    budget.used += report.trials_run
    if report.stopped == "interrupted":
        raise KeyboardInterrupt
    if report.after is None or report.last_failing is None:
        return first
    result.shrunk = {"removed": list(report.removed), "run": report.last_failing}
    return report.last_failing


def _try_variant(
    result: TriggerResult, cell: _Cell, n: int, seed: int, out: Path, ctx: tuple[_Budget, Any]
) -> bool:
    """Run one variant; True when it is the one that diverged (and so the last tried)."""
    budget, on_result = ctx
    runs, interrupted = _trials(cell, n, seed, out, on_result)
    _tally(result, runs)
    if interrupted:
        raise KeyboardInterrupt
    if not result.failures:
        return False
    result.confirmed = _confirm(result, cell, out)
    result.export = _export(_shrunk(result, cell, out, budget), out / "export")
    return True


def _hunt_one(
    cand: Candidate,
    result: TriggerResult,
    cfg: HuntConfig,
    budget: _Budget,
    on_result,
    natural: bool,
) -> None:
    """The candidate's natural variants (`natural`) or its perturbations, in order, until one
    diverges."""
    from hicache_diag.engines.registry import build

    for i, variant in enumerate(cand.trigger.variants):
        if (variant.fault is None) != natural:
            continue
        if not budget.left():
            result.skipped.append(f"{variant.fault or 'natural'}: budget spent")
            continue
        try:
            options = variant_options(cfg.base, variant)
            cell = _Cell(options, build(options))
        except UsageError as exc:
            result.skipped.append(f"{variant.fault or 'natural'}: {exc}")
            continue
        result.fault, result.natural = variant.fault, variant.fault is None
        n = budget.left()
        budget.used += n
        out = cfg.out / cand.trigger.name / f"variant{i}"
        if _try_variant(result, cell, n, options.seed, out, (budget, on_result)):
            break


def run_hunt(
    cfg: HuntConfig,
    candidates: list[Candidate],
    release: str,
    on_result: Callable[[Cell, BisectTrial], None] | None = None,
) -> HuntReport:
    """Every candidate's natural trigger first, then the perturbations of those that did not
    diverge: a divergence SGLang has with no fault is what the hunt is for, and a budget spent
    on one candidate's faults must not starve another's natural trigger."""
    report = HuntReport(release)
    budget = _Budget(cfg)
    results: dict[str, TriggerResult] = {}
    try:
        for natural in (True, False):
            for cand in candidates:
                if not budget.left():
                    report.stopped = "budget"
                    break
                result = results.get(cand.trigger.name)
                if result is None:
                    result = TriggerResult(cand.trigger.name, cand.trigger.what, cand.sources)
                    results[cand.trigger.name] = result
                    report.results.append(result)  # kept, partial, on Ctrl-C
                elif result.failures:
                    continue  # diverged naturally: no perturbation needed
                _hunt_one(cand, result, cfg, budget, on_result, natural)
    except KeyboardInterrupt:
        report.stopped = "interrupted"
    report.trials_run = budget.used
    return report


__all__ = ["HuntConfig", "first_divergence_of", "run_hunt", "variant_options"]
