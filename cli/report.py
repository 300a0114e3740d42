"""`hicache-diag report RUN_DIR`: render a run directory (verdict, divergence, timelines, plots)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from hicache_diag.cli.options import with_default
from hicache_diag.cli.render.console import print_json


def _render(report, summary: Path | None) -> None:
    from rich.console import Console

    from hicache_diag.cli.render.report import markdown_summary, render_report

    # Piped output gets wide tables instead of rich's 80-column truncation.
    width = None if sys.stdout.isatty() else 140
    render_report(report, Console(highlight=False, width=width))
    if summary is not None:
        markdown_summary(report, summary)
        typer.echo(f"summary: {summary}")


EXAMPLES = """\b
Examples:
  hicache-diag report runs/20261201T030000.000000-0
  hicache-diag report samples/runs/form_a --plots /tmp/plots
  hicache-diag report samples/runs/form_c --json

Exit: 0 rendered, 3 the run dir cannot decide (never finished or stepped),
2 bad input (not a run directory, a damaged file, a bad output path),
1 internal error."""


def register(app: typer.Typer) -> None:
    @app.command(
        "report", epilog=EXAMPLES, short_help="Render a run directory: verdict, divergence, plots."
    )
    def report(
        run_dir: Annotated[
            str,
            typer.Argument(
                metavar="RUN_DIR", help="A run directory (runs/<utc>-<seed>/).", show_default=False
            ),
        ],
        plots: Annotated[
            str | None,
            typer.Option("--plots", metavar="DIR", help="Write per-rank timeline PNGs here."),
        ] = None,
        summary: Annotated[
            str | None,
            typer.Option(
                "--summary",
                metavar="FILE",
                help=with_default("Markdown summary file.", "PLOTS/report.md"),
            ),
        ] = None,
        json_out: Annotated[
            bool, typer.Option("--json", help="Print the verdict as JSON.")
        ] = False,
        reclassify: Annotated[
            bool, typer.Option("--reclassify", help="Ignore verdict.json; classify afresh.")
        ] = False,
    ) -> None:
        """Render a run directory: verdict, first divergence, per-rank timelines and plots."""
        from hicache_diag.cli.render.console import err_console
        from hicache_diag.cli.render.status import reading_status
        from hicache_diag.diagnosis.report import build_report  # pandas only when used
        from hicache_diag.paths import input_dir, output_dir, output_file
        from hicache_diag.verdict import ExitCode

        input_dir("RUN_DIR", run_dir)
        output_dir("--plots", plots)
        output_file("--summary", summary)
        plots_dir = None if plots is None else Path(plots)
        summary_file = None if summary is None else Path(summary)
        if summary_file is None and plots_dir is not None:
            output_file("--summary", plots_dir / "report.md")
        with reading_status(err_console, Path(run_dir).glob("rank*.*"), quiet=json_out):
            result = build_report(Path(run_dir), plots_dir, reclassify)
        if result.reclassified is not None:  # say so: the recorded verdict is not what is shown
            sys.stderr.write(f"note: --reclassify: {result.reclassified}; classified afresh "
                             "from the evidence\n")  # fmt: skip
        if summary_file is None and plots_dir is not None:
            summary_file = plots_dir / "report.md"
        if json_out:
            if summary_file is not None:
                from hicache_diag.cli.render.report import markdown_summary

                markdown_summary(result, summary_file)
            print_json(result.verdict.to_json())
        else:
            _render(result, summary_file)
        # A run dir that cannot decide (never finished, never stepped) says so in the status.
        undecided = result.verdict.exit_code is ExitCode.UNDECIDED
        raise typer.Exit(int(ExitCode.UNDECIDED) if undecided else 0)
