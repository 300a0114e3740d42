"""The report of one run directory: verdict, divergence window, timelines, plots (data only)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from hicache_diag import evidence as ev
from hicache_diag.diagnosis.classify import verdict_from
from hicache_diag.diagnosis.consensus import checker_silent
from hicache_diag.diagnosis.load import RunData, load_run
from hicache_diag.diagnosis.outputs import TieTolerance
from hicache_diag.diagnosis.series import around, timelines
from hicache_diag.errors import RunDirError
from hicache_diag.evidence.verdict import Outcome, Verdict

EVIDENCE_VERSION = ev.EVIDENCE_VERSION  # docs/evidence.md


@dataclass(slots=True)
class RunReport:
    run: RunData
    verdict: Verdict
    recorded: bool  # the verdict came from verdict.json rather than a fresh classification
    window: pd.DataFrame  # the diverging field, step x rank, around the first divergence
    timelines: pd.DataFrame
    images: list = field(default_factory=list)  # diagnosis.plots.Plot, rendered in memory
    written: list[Path] = field(default_factory=list)  # every file this report wrote
    notes: list[str] = field(default_factory=list)  # what an old or partial run lacks
    reclassified: str | None = None  # --reclassify: what the recorded verdict.json said
    # first_divergence/rank{r}.json: each rank's state when SGLang's consensus checker fired
    blocks: dict[int, ev.DivergenceBlock] = field(default_factory=dict)


def _recorded_verdict(run: RunData) -> Verdict | None:
    """verdict.json as written; a file that is not a verdict is damaged (exit 2), never
    silently replaced by a fresh classification (that is what --reclassify asks for)."""
    if run.verdict_error is not None:
        raise RunDirError(
            f"{run.run_dir / ev.VERDICT} is damaged: {run.verdict_error}; "
            "`report --reclassify` classifies the evidence afresh"
        )
    return run.verdict


def _reclassified_line(run: RunData) -> str:
    if run.verdict_error is not None:
        return f"the recorded verdict.json was damaged ({run.verdict_error})"
    if run.verdict is None:
        return "no verdict.json was recorded"
    return f"the recorded verdict.json said {run.verdict.outcome.value}"


def _notes(run: RunData) -> list[str]:
    notes = []
    version = run.evidence_version
    if version < EVIDENCE_VERSION:
        notes.append(
            f"evidence_version {version} (older than {EVIDENCE_VERSION}): keys this "
            "version lacks are left out of tables and plots"
        )
    notes += [f"missing: {m}" for m in run.missing]
    if run.bad_lines:
        notes.append(f"{run.bad_lines} torn jsonl line(s) skipped")
    return notes


def build_report(
    run_dir: Path,
    plots: bool = False,
    reclassify: bool = False,
    tie_tolerance: TieTolerance | None = None,
) -> RunReport:
    """Load and analyse `run_dir`; `plots`: draw the timeline plots (in memory, not written);
    `tie_tolerance`: the run's engine's (diagnosis/outputs.py)."""
    run = load_run(run_dir, tie_tolerance)
    recorded = None if reclassify else _recorded_verdict(run)
    verdict = recorded or verdict_from(run)
    if recorded is not None and recorded.outcome is Outcome.OK:
        # An `ok` recorded by an older version is re-checked: a run dir that shows no finished
        # run (no launcher.json, no steps, no outputs) or an interrupt is never `ok`.
        fresh = verdict_from(run)
        if fresh.outcome in (Outcome.UNDECIDED, Outcome.INTERRUPTED):
            verdict, recorded = fresh, None
    fd = verdict.first_divergence
    window = around(run.frames, fd.step, fd.field, at_step=fd.values) if fd else pd.DataFrame()
    report = RunReport(run, verdict, recorded is not None, window, timelines(run.frames))
    report.notes = _notes(run)
    try:
        report.blocks = ev.read_blocks(run_dir)
    except ValueError as exc:
        report.notes.append(f"first-divergence block unreadable: {exc}")
    silent = checker_silent(run.logs, report.blocks)
    if silent:
        report.notes.append(silent)
    if reclassify:
        report.reclassified = _reclassified_line(run)
    if plots:
        from hicache_diag.diagnosis.plots import render_plots  # matplotlib only when asked

        report.images = render_plots(run.frames, fd.step if fd else None)
    return report
