"""Shrinking a failing run: the run's own options, then ddmin over its faults, the smallest
request count, and each remaining fault's window narrowed to the first divergence, each
candidate judged by N fresh trials ("still fails the same way": same outcome and form in any
of them). What was removed is said; the last failing trial is the shrunk run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hicache_diag.errors import UsageError
from hicache_diag.evidence.files import read_json
from hicache_diag.evidence.verdict import Verdict
from hicache_diag.options.run_options import RunOptions
from hicache_diag.shrink.ddmin import ddmin, smallest_count
from hicache_diag.trials.trials import run_trials, trial_verdict, verdict_in

SHRINK_JSON = "shrink.json"  # ShrinkReport.to_json, in a shrink's --out


def shrunk_run(shrink_dir: Path) -> Path | None:
    """The run a shrink dir stands for: its last failing trial, the shrunk failure; None when
    the dir holds no shrink that got anywhere (not reproduced, or no trial failed alike)."""
    try:
        record = read_json(shrink_dir / SHRINK_JSON)  # bounded (evidence/files.py)
    except (OSError, ValueError):
        return None
    last = record.get("last_failing") if isinstance(record, dict) else None
    return Path(last) if isinstance(last, str) and verdict_in(last) is not None else None


@dataclass(frozen=True, slots=True)
class KeptFailure:
    """The failure to keep: the original verdict's outcome and crash form."""

    outcome: str
    form: str | None

    def met(self, verdict: Verdict | None) -> bool:
        if verdict is None:
            return False
        form = verdict.form.value if verdict.form else None
        return (verdict.outcome.value, form) == (self.outcome, self.form)


@dataclass(slots=True)
class ShrinkReport:
    run_dir: str
    target: KeptFailure
    before: RunOptions
    after: RunOptions | None = None
    removed: list[str] = field(default_factory=list)
    trials_run: int = 0
    last_failing: str | None = None
    stopped: str | None = None  # "not reproduced" | "budget" | "interrupted"

    def to_json(self) -> dict[str, Any]:
        after = self.after or self.before
        return {
            "schema": "hicache-diag/shrink/v1",
            "run_dir": self.run_dir,
            "target": {"outcome": self.target.outcome, "form": self.target.form},
            "before": {"faults": list(self.before.faults), "requests": self.before.requests},
            "after": {"faults": list(after.faults), "requests": after.requests},
            "removed": list(self.removed),
            "trials_run": self.trials_run,
            "last_failing": self.last_failing,
            "stopped": self.stopped,
        }


class _Oracle:
    """`fails(options)`: N fresh trials of those options; True when one fails like the target.
    Out of budget, it answers False, so the shrink keeps what it has."""

    def __init__(self, target: KeptFailure, trials: int, budget: int, out: Path, on_result) -> None:
        self.target, self.trials, self.budget, self.out = target, trials, budget, out
        self.on_result, self.used, self.tries = on_result, 0, 0
        self.last: str | None = None
        self.last_step: int | None = None
        self.spent = False

    def fails(self, options: RunOptions) -> bool:
        from hicache_diag.engines.registry import build, engine

        if self.used + self.trials > self.budget:
            self.spent = True
            return False
        try:
            cfg = build(options)
        except UsageError:
            return False  # a candidate the engine cannot take cannot fail
        self.tries += 1
        out = self.out / f"try{self.tries:03d}"
        timeout, preload = type(options).trial_timeout_s, engine(options.engine).preload
        runs, interrupted = run_trials(
            cfg, self.trials, options.seed, out, timeout, self.on_result, preload
        )
        self.used += len(runs)
        if interrupted:
            raise KeyboardInterrupt
        for run in runs:
            verdict = trial_verdict(run)
            if self.target.met(verdict):
                self.last = run.run_dir
                fd = verdict.first_divergence
                self.last_step = fd.step if fd is not None else None
                return True
        return False


def _with_fault_keys(spec: str, **keys: int) -> str:
    from hicache_diag.faults.spec import make_fault_spec, parse_fault_spec

    parsed = parse_fault_spec(spec)
    params = {**dict(parsed.params), **{k: str(v) for k, v in keys.items()}}
    return make_fault_spec(parsed.name, params.items()).to_spec()


def _with_fault(options: RunOptions, i: int, spec: str) -> RunOptions:
    return replace(options, faults=(*options.faults[:i], spec, *options.faults[i + 1 :]))


def _narrow_one(options: RunOptions, i: int, oracle: _Oracle, report: ShrinkReport) -> RunOptions:
    """Fault i's window cut to end at the first divergence, then to start as late as it can."""
    from hicache_diag.faults import parse_fault_spec

    spec, step = options.faults[i], oracle.last_step
    fault = parse_fault_spec(spec).build()
    if step is None or fault.after >= step:
        return options
    if fault.until is None or fault.until > step:
        cut = _with_fault_keys(spec, until=step)
        if oracle.fails(_with_fault(options, i, cut)):
            report.removed.append(f"{spec}: steps after {step} (the first divergence)")
            spec, options = cut, _with_fault(options, i, cut)
    start = fault.after

    def late_start_fails(k: int) -> bool:  # k: steps the window keeps before `step`
        if k == step - start:
            return True  # the window as it is: known to fail
        return oracle.fails(_with_fault(options, i, _with_fault_keys(spec, after=step - k)))

    k = smallest_count(step - start, late_start_fails, low=0)
    if step - k > start:
        report.removed.append(f"{spec}: steps {start}-{step - k - 1}")
        options = _with_fault(options, i, _with_fault_keys(spec, after=step - k))
    return options


def _narrow_windows(options: RunOptions, oracle: _Oracle, report: ShrinkReport) -> RunOptions:
    for i in range(len(options.faults)):
        options = report.after = _narrow_one(options, i, oracle, report)
    return options


def _shrink(base: RunOptions, oracle: _Oracle, report: ShrinkReport) -> RunOptions:
    """Faults, then requests, then windows; `report.after` holds the best so far (Ctrl-C)."""
    faults = list(base.faults)
    if faults:
        kept = ddmin(faults, lambda fs: oracle.fails(replace(base, faults=tuple(fs))))
        report.removed += [f"fault {f}" for f in faults if f not in kept]
        base = report.after = replace(base, faults=tuple(kept))
    top = base.requests
    n = smallest_count(top, lambda n: n == top or oracle.fails(replace(base, requests=n)))
    if n < top:
        report.removed.append(f"requests {n + 1}-{top} (of {top})")
        base = report.after = replace(base, requests=n)
    return _narrow_windows(base, oracle, report)


def shrink_run(
    base: RunOptions,
    target: KeptFailure,
    run_dir: str,
    out: Path,
    trials: int = 2,
    budget: int = 40,
    on_result: Callable | None = None,
) -> ShrinkReport:
    report = ShrinkReport(run_dir, target, base)
    oracle = _Oracle(target, trials, budget, out, on_result)
    try:
        if not oracle.fails(base):
            report.stopped = "budget" if oracle.spent else "not reproduced"
        else:
            report.after = _shrink(base, oracle, report)
            report.stopped = "budget" if oracle.spent else None
    except KeyboardInterrupt:
        report.stopped = "interrupted"
    report.trials_run, report.last_failing = oracle.used, oracle.last
    return report
