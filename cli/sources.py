"""`hicache-diag sources`: the divergence-source inventory of a release's source tree (static),
the difference between two releases' inventories, or which recorded reads differed across ranks
in a real-engine run (`--run`, dynamic)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hicache_diag.cli.render.console import err_console, print_json
from hicache_diag.errors import UsageError

EXAMPLES = """\b
Examples:
  hicache-diag sources --source sglang-0.5.23-wheel/ --json
  hicache-diag sources --diff wheel-0.5.12.post1/ wheel-0.5.23/
  hicache-diag sources --run RUN_DIR --source wheel-0.5.23/

Exit: 0 inventory printed, 2 bad input (no such tree, a Python without SGLang, a run
dir with no recorded source reads), 1 internal error."""

def _tree(source: Path | None, python: str | None, engine: str):
    from hicache_diag.engines import ENGINES

    if engine not in ENGINES:
        raise UsageError(f"--engine {engine}: choose one of {', '.join(ENGINES)}")
    if source is not None and python is not None:
        raise UsageError("--source and --sglang-python name two trees: give one")
    return ENGINES[engine].sources(source, python)


def _scan(tree):
    from hicache_diag.sources.scan import scan_tree

    err_console.print(f"sources: scanning {tree.engine} {tree.version} at {tree.root}")
    return scan_tree(tree.root, tree.engine, tree.version)


def register(app: typer.Typer) -> None:
    @app.command(
        "sources", epilog=EXAMPLES, short_help="List the per-rank reads that feed decisions."
    )
    def sources(
        source: Annotated[
            Path | None,
            typer.Option(
                "--source",
                metavar="DIR",
                help="An unzipped SGLang wheel or sglang package dir to scan.",
                show_default=False,
            ),
        ] = None,
        sglang_python: Annotated[
            str | None,
            typer.Option(
                "--sglang-python",
                metavar="PY",
                help="Scan the SGLang this Python has (found without importing it).",
                show_default=False,
            ),
        ] = None,
        engine: Annotated[
            str,
            typer.Option("--engine", metavar="NAME", help="sglang, or builtin (our runtime)."),
        ] = "sglang",
        diff: Annotated[
            tuple[str, str] | None,
            typer.Option(
                "--diff",
                metavar="A B",
                help="Compare two trees (dirs, Pythons or 'builtin').",
                show_default=False,
            ),
        ] = None,
        show_all: Annotated[
            bool, typer.Option("--all", help="Also list reads whose decision is unknown.")
        ] = False,
        run: Annotated[
            Path | None,
            typer.Option(
                "--run",
                metavar="RUN_DIR",
                help="Dynamic: which recorded reads differed across ranks in this sglang run.",
                show_default=False,
            ),
        ] = None,
        json_out: Annotated[bool, typer.Option("--json", help="Print only the JSON.")] = False,
    ) -> None:
        """Inventory the reads of per-rank physical quantities (clocks, event readiness, queue
        and pool sizes, allocation results, storage reads) in SGLang's scheduler, cache,
        controller and session code: the decision each feeds and how ranks are aligned on it.
        With no tree named, the SGLang of the current Python. Static; heuristic rules in
        docs/sources.md. With --run, the dynamic half: per source, the steps where the ranks
        read different values and whether the decision it feeds acted there (with --source or
        --sglang-python naming the run's release: each read's file:line and alignment)."""
        if run is not None:
            if diff is not None:
                raise UsageError("--run reads one run dir: drop --diff")
            if engine != "sglang":
                raise UsageError("--run reads what the sglang plugin recorded: drop --engine")
            from hicache_diag.sources.dynamic import analyze_run, with_inventory

            result = analyze_run(run)
            if source is not None or sglang_python is not None:  # file:line of each read
                result = with_inventory(result, _scan(_tree(source, sglang_python, engine)))
            if json_out:
                print_json(result.to_json())
            else:
                from hicache_diag.cli.render.sources import render_run_sources

                render_run_sources(result)
            raise typer.Exit(0)
        if diff is not None:
            if source is not None or sglang_python is not None:
                raise UsageError("--diff names both trees: drop --source/--sglang-python")
            from hicache_diag.sources.diff import diff_inventories
            from hicache_diag.sources.locate import any_tree

            a, b = (_scan(any_tree(spec)) for spec in diff)
            result = diff_inventories(a, b)
            if json_out:
                print_json(result.to_json())
            else:
                from hicache_diag.cli.render.sources import render_diff

                render_diff(result, show_all=show_all)
            raise typer.Exit(0)
        inventory = _scan(_tree(source, sglang_python, engine))
        if json_out:
            print_json(inventory.to_json())
        else:
            from hicache_diag.cli.render.sources import render_inventory

            render_inventory(inventory, show_all=show_all)
        raise typer.Exit(0)
