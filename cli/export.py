"""`hicache-diag export RUN_DIR`: what an SGLang maintainer needs to act on a run, with nothing of
ours to install: a unit test in SGLang's style, a launch script and requests, a report."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hicache_diag.cli.params import with_default
from hicache_diag.errors import UsageError

EXAMPLES = """\b
Examples:
  hicache-diag export samples/runs/sglang-0.5.23-form-b
  hicache-diag export runs/20261201T054025.031000-0 --out /tmp/repro
  hicache-diag export runs/shrink-20261203T101500Z   # its shrunk run

Files --out already holds are replaced only with --force; a run's evidence never.

Exit: 0 exported, 2 bad input (not a run directory, not a real-SGLang crash, a crash
export has no test for, an unwritable or taken --out), 1 internal error."""


def _the_run(run_dir: Path) -> Path:
    """A shrink's dir stands for its shrunk failure (hicache-diag shrink's --out)."""
    from hicache_diag.cli.render.console import err_console
    from hicache_diag.shrink.shrink import SHRINK_JSON, shrunk_run

    if not (run_dir / SHRINK_JSON).is_file():
        return run_dir
    shrunk = shrunk_run(run_dir)
    if shrunk is None:
        raise UsageError(f"{run_dir}: a shrink with no shrunk failing run to export")
    err_console.print(f"export: the shrunk run {shrunk}")
    return shrunk


def _say(done) -> None:
    from hicache_diag.cli.render.console import err_console, escape_controls

    err_console.print(f"export: {done.recipe.title} (SGLang {done.version})")
    if done.lines_from is None:
        err_console.print(
            f"note: no SGLang {done.version} source found here; REPORT.md "
            "gives the traceback's lines only"
        )
    for path in done.files:
        typer.echo(escape_controls(str(path)))
    typer.echo(escape_controls(f"run the test: python -m pytest -q {done.test}"))


def register(app: typer.Typer) -> None:
    @app.command(
        "export",
        epilog=EXAMPLES,
        short_help="Write a repro for SGLang maintainers: unit test, launch script, report.",
    )
    def export(
        run_dir: Annotated[
            str,
            typer.Argument(
                metavar="RUN_DIR",
                help="A run directory of --engine sglang, or a shrink's dir.",
                show_default=False,
            ),
        ],
        out: Annotated[
            str | None,
            typer.Option(
                "--out",
                metavar="DIR",
                help=with_default("Where to write.", "export-<RUN_DIR name> here"),
            ),
        ] = None,
        force: Annotated[
            bool,
            typer.Option("--force", help="Replace files --out already holds (never evidence)."),
        ] = False,
    ) -> None:
        """Turn a real-SGLang crash into what a maintainer can run without hicache-diag: a unit
        test in SGLang's test style driving the release's real code through the branch the run
        took (it fails on an affected release), a launch script with the server flags and the
        request sequence, and REPORT.md (invariant, mechanism with file:line, evidence,
        upstream threads, release range). docs/export.md."""
        from hicache_diag.evidence.output_paths import claim_dir
        from hicache_diag.evidence.paths import input_dir
        from hicache_diag.export.export import export_run

        input_dir("RUN_DIR", run_dir)
        claim_dir("--out", out)  # its kind and mode now; the files once the recipe names them
        target = Path(out) if out is not None else Path(f"export-{Path(run_dir).resolve().name}")
        done = export_run(_the_run(Path(run_dir)), target, force)
        _say(done)
        raise typer.Exit(0)
