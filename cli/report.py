"""`hicache-diag report RUN_DIR`: render a run directory (verdict, divergence, timelines, plots)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hicache_diag.cli.options import with_default
from hicache_diag.cli.render.console import print_json
from hicache_diag.errors import UsageError


def _render(report, summary: Path | None) -> None:
    import sys

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
2 not a run directory or damaged."""


def register(app: typer.Typer) -> None:
    @app.command(
        "report", epilog=EXAMPLES, short_help="Render a run directory: verdict, divergence, plots."
    )
    def report(
        run_dir: Annotated[
            Path,
            typer.Argument(
                metavar="RUN_DIR", help="A run directory (runs/<utc>-<seed>/).", show_default=False
            ),
        ],
        plots: Annotated[
            Path | None,
            typer.Option("--plots", metavar="DIR", help="Write per-rank timeline PNGs here."),
        ] = None,
        summary: Annotated[
            Path | None,
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
        from hicache_diag.diagnosis.report import build_report  # pandas only when used
        from hicache_diag.verdict import ExitCode

        if plots is not None and plots.exists() and not plots.is_dir():
            raise UsageError(f"--plots {str(plots)!r} is a file; give a directory for the PNGs")
        if summary is not None and summary.is_dir():
            raise UsageError(f"--summary {str(summary)!r} is a directory; give a file name")
        result = build_report(run_dir, plots, reclassify)
        if summary is None and plots is not None:
            summary = plots / "report.md"
        if json_out:
            if summary is not None:
                from hicache_diag.cli.render.report import markdown_summary

                markdown_summary(result, summary)
            print_json(result.verdict.to_json())
        else:
            _render(result, summary)
        # A run dir that cannot decide (never finished, never stepped) says so in the status.
        undecided = result.verdict.exit_code is ExitCode.UNDECIDED
        raise typer.Exit(int(ExitCode.UNDECIDED) if undecided else 0)
