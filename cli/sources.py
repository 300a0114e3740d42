"""`hicache-diag sources`: the divergence-source inventory of a release's source tree (static),
the difference between two releases' inventories, or which recorded reads differed across ranks
in a real-engine run (`--run`, dynamic)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import typer

from hicache_diag.cli.params import Check, Parsed, check, flag
from hicache_diag.cli.render.console import err_console, print_json
from hicache_diag.cli.run_flags import ENGINE
from hicache_diag.engines.registry import release_options
from hicache_diag.errors import UsageError
from hicache_diag.options.params import Param, restated

EXAMPLES = """\b
Examples:
  hicache-diag sources --source sglang-0.5.23-wheel/ --json
  hicache-diag sources --diff wheel-0.5.12.post1/ wheel-0.5.23/
  hicache-diag sources --run RUN_DIR --source wheel-0.5.23/

Exit: 0 inventory printed, 2 bad input (no such tree, a Python without SGLang, a run
dir with no recorded source reads), 1 internal error."""

SOURCE = Param("--source", "An unzipped SGLang wheel or sglang package dir to scan.", "DIR")
PYTHON = restated(
    release_options(),
    "sglang_python",
    "Scan the SGLang this Python has (found without importing it).",
    "PY",
)
DIFF = Param("--diff", "Compare two trees (dirs, Pythons or 'builtin').", "A B")
ALL = Param("--all", "Also list reads whose decision is unknown.")
RUN = Param(
    "--run", "Dynamic: which recorded reads differed across ranks in this sglang run.", "RUN_DIR"
)
JSON = Param("--json", "Print only the JSON.")

SourceOpt = flag(SOURCE, Path | None)
PythonOpt = flag(PYTHON, str | None)
EngineOpt = flag(ENGINE, str, "sglang")
DiffOpt = flag(DIFF, tuple[str, str] | None)
AllOpt = flag(ALL, bool)
RunOpt = flag(RUN, Path | None)
JsonOpt = flag(JSON, bool)


def _engine_against_tree(p: Parsed) -> str | None:
    # (--engine builtin --source: the builtin engine's own sources() says "drop --source")
    from hicache_diag.engines.registry import ENGINES, engine, takes_releases

    name = p.value(ENGINE)
    if name in ENGINES and not takes_releases(name) and p.given(PYTHON):
        summary = engine(name).options.summary
        return f"{ENGINE} {name} scans {summary}, not an SGLang's: drop {PYTHON}"
    return None


def _self_or_all(p: Parsed) -> str | None:
    diff = p.value(DIFF)
    if diff and len(set(diff)) == 1:
        return f"{DIFF} {diff[0]} {diff[1]} compares a tree with itself: name two trees"
    if p.value(ALL) and p.given(RUN):
        return f"{ALL} lists a scan's undecided reads: it does nothing with {RUN}"
    return None


# sources' input rules (what only a tree or a run dir can tell is said where it is read).
CHECKS = (
    Check("engine-against-named-tree", _engine_against_tree),
    Check("diff-with-itself-or-all-with-run", _self_or_all),
)


@dataclass(frozen=True, slots=True)
class SourcesArgs:
    source: Path | None
    python: str | None
    engine: str
    diff: tuple[str, str] | None
    show_all: bool
    run: Path | None


def _tree(source: Path | None, python: str | None, engine: str):
    from hicache_diag.engines.registry import ENGINES

    if engine not in ENGINES:
        raise UsageError(f"--engine {engine}: choose one of {', '.join(ENGINES)}")
    if source is not None and python is not None:
        raise UsageError("--source and --sglang-python name two trees: give one")
    return ENGINES[engine].sources(source, python)


def _scan(tree):
    from hicache_diag.sources.scan import scan_tree

    err_console.print(f"sources: scanning {tree.engine} {tree.version} at {tree.root}")
    return scan_tree(tree)


def _run_sources(a: SourcesArgs):
    if a.diff is not None:
        raise UsageError("--run reads one run dir: drop --diff")
    from hicache_diag.engines.registry import require_recorded_reads
    from hicache_diag.sources.dynamic import analyze_run, with_inventory

    require_recorded_reads(a.engine)

    result = analyze_run(a.run)
    if a.source is not None or a.python is not None:  # file:line of each read
        result = with_inventory(result, _scan(_tree(a.source, a.python, a.engine)))
    return result


def _diff_sources(a: SourcesArgs):
    if a.source is not None or a.python is not None:
        raise UsageError("--diff names both trees: drop --source/--sglang-python")
    from hicache_diag.engines.registry import release_trees
    from hicache_diag.sources.diff import diff_inventories
    from hicache_diag.sources.locate import any_tree

    python_tree, named = release_trees()
    old, new = (_scan(any_tree(spec, python_tree, named)) for spec in a.diff)
    return diff_inventories(old, new)


def compute(a: SourcesArgs):
    """What the command prints: a run's per-source comparison, a diff, or an inventory."""
    if a.run is not None:
        return _run_sources(a)
    if a.diff is not None:
        return _diff_sources(a)
    return _scan(_tree(a.source, a.python, a.engine))


def render(a: SourcesArgs, result) -> None:
    from hicache_diag.cli.render import sources as r

    if a.run is not None:
        r.render_run_sources(result)
    elif a.diff is not None:
        r.render_diff(result, show_all=a.show_all)
    else:
        r.render_inventory(result, show_all=a.show_all)


def register(app: typer.Typer) -> None:
    @app.command(
        "sources", epilog=EXAMPLES, short_help="List the per-rank reads that feed decisions."
    )
    def sources(
        ctx: typer.Context,
        source: SourceOpt = None,
        sglang_python: PythonOpt = None,
        engine: EngineOpt = "sglang",
        diff: DiffOpt = None,
        show_all: AllOpt = False,
        run: RunOpt = None,
        json_out: JsonOpt = False,
    ) -> None:
        """Inventory the reads of per-rank physical quantities (clocks, event readiness, queue
        and pool sizes, allocation results, storage reads, random draws) in SGLang's
        scheduler, cache, controller and session code and the modules they import: the
        decision each feeds and how ranks are aligned on it (per code branch where it
        differs). Logical per-rank state (queue lengths, idle checks) is listed apart. With
        no tree named, the SGLang of the current Python. Static; heuristic rules in
        docs/sources.md. With --run, the dynamic half: per source, the steps where the ranks
        read different values and whether the decision it feeds acted there (with --source or
        --sglang-python naming the run's release: each read's file:line and alignment)."""
        check(ctx, CHECKS)
        args = SourcesArgs(source, sglang_python, engine, diff, show_all, run)
        result = compute(args)
        if json_out:
            print_json(result.to_json())
        else:
            render(args, result)
        raise typer.Exit(0)
