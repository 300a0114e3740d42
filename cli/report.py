"""`hicache-diag report RUN_DIR`: render a run directory (verdict, divergence, timelines, plots),
or a hunt's directory re-judged from its runs (cli/report_hunt.py)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from hicache_diag.cli.params import Check, Parsed, check, flag
from hicache_diag.cli.render.console import print_json
from hicache_diag.options.params import Param

RunDir = Annotated[
    str,
    typer.Argument(
        metavar="RUN_DIR",
        help="A run directory (runs/<utc>-<seed>/), or a hunt's (its hunt.json).",
        show_default=False,
    ),
]
PLOTS = Param("--plots", "Write the timeline PNGs, report.md and report.html here.", "DIR")
SUMMARY = Param("--summary", "Markdown summary file.", "FILE")
HTML = Param("--html", "One self-contained HTML report, plots inline.", "FILE")
FORCE = Param("--force", "Replace existing output files (never a run's evidence).")
SAVE = Param(
    "--save", "A hunt dir: rewrite hunt.json's first divergences and table.txt (with --force)."
)
Plots = flag(PLOTS, str | None)
Summary = flag(SUMMARY, str | None, "PLOTS/report.md")
Html = flag(HTML, str | None, "PLOTS/report.html")
Force = flag(FORCE, bool)
Save = flag(SAVE, bool)


def _force_without_outputs(p: Parsed) -> str | None:
    if p.value(FORCE) and not p.given(PLOTS, SUMMARY, HTML, SAVE):
        return (
            f"{FORCE} replaces output files: it does nothing without {PLOTS}, {SUMMARY}, "
            f"{HTML} or {SAVE}"
        )
    return None


# report's input rules over its flags (what the directory is decides the rest: a hunt's takes
# its own, cli/report_hunt.py).
CHECKS = (Check("force-without-outputs", _force_without_outputs),)
JsonOut = Annotated[
    bool, typer.Option("--json", help="Print the verdict (a hunt dir: its report) as JSON.")
]
Reclassify = Annotated[
    bool, typer.Option("--reclassify", help="Ignore verdict.json; classify afresh.")
]


@dataclass(frozen=True, slots=True)
class ReportOutputs:
    """Where this report writes, claimed (output_paths.py) before the run dir is read."""

    plots: Path | None
    summary: Path | None
    html: Path | None

    @property
    def drawing(self) -> bool:
        return self.plots is not None or self.html is not None


def claim_outputs(
    plots: str | None, summary: str | None, html: str | None, force: bool
) -> ReportOutputs:
    from hicache_diag.diagnosis.plots import PLOT_NAMES
    from hicache_diag.errors import UsageError
    from hicache_diag.evidence.output_paths import claim_dir, claim_file

    names = list(PLOT_NAMES)
    names += ["report.md"] if summary is None else []
    names += ["report.html"] if html is None else []
    folder = claim_dir("--plots", plots, tuple(names), force)
    md = claim_file("--summary", summary, force)
    page = claim_file("--html", html, force)
    if folder is not None:
        md = md or folder / "report.md"
        page = page or folder / "report.html"
    targets = [p.resolve() for p in (md, page) if p is not None]
    targets += [(folder / n).resolve() for n in PLOT_NAMES] if folder is not None else []
    if len(set(targets)) != len(targets):
        raise UsageError(f"--summary and --html name the same file or a plot ({md}, {page})")
    return ReportOutputs(folder, md, page)


def make_report(run_dir: Path, outs: ReportOutputs, reclassify: bool, quiet: bool):
    """Read and classify the run dir, then write what `outs` names, atomically."""
    from hicache_diag.cli.render.console import err_console
    from hicache_diag.cli.render.report import markdown_summary
    from hicache_diag.cli.render.report_html import html_report
    from hicache_diag.cli.render.status import reading_status
    from hicache_diag.diagnosis.report import build_report  # pandas only when used
    from hicache_diag.engines.registry import tie_tolerance
    from hicache_diag.evidence.output_paths import write_atomic

    with reading_status(err_console, run_dir.glob("rank*.*"), quiet=quiet):
        result = build_report(run_dir, outs.drawing, reclassify, tie_tolerance)
    if result.reclassified is not None:  # say so: the recorded verdict is not what is shown
        sys.stderr.write(
            f"note: --reclassify: {result.reclassified}; classified afresh from the evidence\n"
        )
    pngs = [] if outs.plots is None else [(outs.plots / p.name, p.png) for p in result.images]
    files = [p for p, _ in pngs] + [p for p in (outs.html, outs.summary) if p is not None]
    for path, png in pngs:
        write_atomic(path, png)
    if outs.html is not None:
        write_atomic(outs.html, html_report(result, outs.html, files))
    if outs.summary is not None:
        write_atomic(outs.summary, markdown_summary(result, outs.summary, files))
    result.written = files
    return result


def _render(report, json_out: bool) -> None:
    if json_out:
        print_json(report.verdict.to_json())
        return
    from hicache_diag.cli.render.console import SafeConsole as Console
    from hicache_diag.cli.render.report import render_report

    # Piped output gets wide tables instead of rich's 80-column truncation.
    width = None if sys.stdout.isatty() else 140
    render_report(report, Console(highlight=False, width=width))


EXAMPLES = """\b
Examples:
  hicache-diag report runs/20261201T030000.000000-0
  hicache-diag report samples/runs/form_a --plots /tmp/plots
  hicache-diag report samples/hunt/sglang-0.5.23-sessions --save --force

Outputs are written only where nothing exists yet, or with --force; a run's
evidence (manifest.json, rank*.jsonl, verdict.json and the rest) never. A hunt
dir (hunt.json) shows the hunt's table with each trigger's first failing run
classified afresh; --save --force rewrites its hunt.json (first divergences
only) and table.txt. A run dir no longer here keeps its recorded entry;
--reclassify is for a run dir (a hunt's first failing runs always are).

Exit: 0 rendered, 3 the run dir cannot decide (never finished or stepped),
2 bad input (not a run directory, a damaged file, a bad or taken output path),
1 internal error."""


def register(app: typer.Typer) -> None:
    @app.command(
        "report", epilog=EXAMPLES, short_help="Render a run directory: verdict, divergence, plots."
    )
    def report(
        ctx: typer.Context,
        run_dir: RunDir,
        plots: Plots = None,
        summary: Summary = None,
        html: Html = None,
        force: Force = False,
        json_out: JsonOut = False,
        reclassify: Reclassify = False,
        save: Save = False,
    ) -> None:
        """Render a run directory: verdict, first divergence, per-rank timelines and plots."""
        from hicache_diag.errors import UsageError
        from hicache_diag.evidence.paths import input_dir
        from hicache_diag.evidence.verdict import ExitCode
        from hicache_diag.hunt.rejudge import is_hunt_dir

        check(ctx, CHECKS)
        input_dir("RUN_DIR", run_dir)
        if is_hunt_dir(Path(run_dir)):  # its first failing runs are always classified afresh
            from hicache_diag.cli.report_hunt import check_hunt_flags, report_hunt

            given = {"--plots": plots, "--summary": summary, "--html": html}
            given["--reclassify"] = reclassify or None
            check_hunt_flags(Path(run_dir), given, save, force)
            report_hunt(Path(run_dir), save, json_out)
            raise typer.Exit(0)
        if save:
            raise UsageError(f"--save rewrites a hunt's hunt.json; {run_dir!r} holds none")
        outs = claim_outputs(plots, summary, html, force)
        result = make_report(Path(run_dir), outs, reclassify, quiet=json_out)
        _render(result, json_out)
        # A run dir that cannot decide (never finished, never stepped) says so in the status.
        undecided = result.verdict.exit_code is ExitCode.UNDECIDED
        raise typer.Exit(int(ExitCode.UNDECIDED) if undecided else 0)
