"""`hicache-diag run`: flags (+ scenario) -> one request -> the engine's config -> one trial ->
verdict panel or JSON."""

from __future__ import annotations

import sys
import textwrap
from typing import TYPE_CHECKING

import typer

from hicache_diag.cli.params import Check, PanelCommand, Parsed, check, flag
from hicache_diag.cli.render.console import err_console, print_json
from hicache_diag.cli.render.progress import LiveProgress
from hicache_diag.cli.render.status import PhaseStatus
from hicache_diag.cli.render.verdict import render_check, render_verdict
from hicache_diag.cli.run_flags import ENGINE, SCENARIO, command_line, configure, with_run_flags
from hicache_diag.engines.registry import DEFAULT_ENGINE, build, engine, run_options, run_trial
from hicache_diag.errors import UsageError
from hicache_diag.evidence.verdict import ExitCode, Outcome
from hicache_diag.options.params import FAULTS, OUTPUT, Param, field_param
from hicache_diag.options.run_options import RunOptions
from hicache_diag.trials.engine import EngineConfig

if TYPE_CHECKING:
    from hicache_diag.faults import Scenario
    from hicache_diag.faults.expect import Expectation

JSON = Param("--json", "Print only the verdict JSON on stdout.", panel=OUTPUT)
LIST_FAULTS = Param(
    "--list-faults",
    "Print every fault (with --engine, those it can run): the physical event it models, when "
    "production meets it, the SGLang function it acts in per release, what it cannot model; "
    "then exit.",
    panel=FAULTS,
)
CHECK = field_param(RunOptions, "check")
JsonOpt = flag(JSON, bool)
ListFaultsOpt = flag(LIST_FAULTS, bool)
ScenarioOpt = flag(SCENARIO, str | None)
EngineOpt = flag(ENGINE, str | None, DEFAULT_ENGINE)


def load_scenario_file(path: str | None) -> Scenario | None:
    """The --scenario file, read once (a device or a FIFO would be read forever)."""
    if path is None:
        return None
    from hicache_diag.evidence.paths import input_file
    from hicache_diag.faults import load_scenario

    input_file(str(SCENARIO), path)
    return load_scenario(path)


def _expectation(scenario: Scenario) -> Expectation:
    """`--check`: the scenario's [expect] table, refused (exit 2) when there is none to check."""
    if scenario.expect is None:
        raise UsageError(
            f"--check: scenario {scenario.path!r} has no [expect] table "
            '(add e.g. [expect] outcome = "crash", form = "B")'
        )
    return scenario.expect


def options_of(ctx: typer.Context) -> RunOptions:
    """The run options a parsed `run` command line gives: its flags over its scenario file,
    every check done."""
    scenario = Parsed(ctx).value(SCENARIO)
    return run_options(command_line(ctx), load_scenario_file(scenario))


def options_from_argv(argv: list[str]) -> RunOptions:
    """What `hicache-diag run ARGV` would run (bisect's pass-through flags, hunt, shrink, the
    benches)."""
    app = typer.Typer(add_completion=False)  # no completion flags: the command alone
    register(app)
    command = typer.main.get_command(app)
    return options_of(command.make_context("run", list(argv)))


# \b keeps click from rewrapping the block.
EXAMPLES = """\b
Examples:
  hicache-diag run              # demo: prefix reuse, eviction, host load-back
  hicache-diag run --scenario samples/scenarios/form_a.toml  # form A: exit 10
  hicache-diag run --engine sglang --nnodes 2 \\
      --scenario samples/scenarios/sglang/form_b_host_alloc_0.5.23.toml
                  # PP0 on node-0, PP1 on node-1 (SGLang's --nnodes, loopback)
                  # form B, culprit rank 1 (node-1 PP1 TP0), exit 11
                  # add --hosts gpu1,gpu2: node i on the i-th host (ssh)

Exit: 0 ok, 10/11/12 form A/B/C, 13 diverged, 14 wrong output, 15 leak,
16 other crash, 3 undecided (also: step budget exhausted), 4 --check mismatch,
130 interrupted, 2 bad input, 1 internal error."""


def _catalogue() -> str:
    """Fault names and --switch switches with their modes (legacy first), from the registries,
    so the help can never drift from what the parser accepts (docs/faults.md has the table)."""
    from hicache_diag.engines.registry import protocol_switches
    from hicache_diag.faults import FAULTS as FAULT_NAMES

    lines = [
        "\b",
        "Faults (--fault NAME[:key=value,...]; keys in docs/faults.md;",
        "what each models: --list-faults):",
    ]
    lines += textwrap.wrap(
        ", ".join(sorted(FAULT_NAMES)),
        76,
        initial_indent="  ",
        subsequent_indent="  ",
        break_on_hyphens=False,
    )
    lines.append("Switches (--switch NAME=MODE; legacy mode first, then the fix):")
    for sw in protocol_switches().values():
        lines.append(f"  {sw.name}={'|'.join(sw.modes)}  {sw.upstream}")
    return "\n".join(lines)


def _list_faults(engine_name: str | None) -> None:
    """`run --list-faults`: what each fault models (faults/catalog.py), then exit 0; with
    --engine, only the faults that engine does not refuse (its options' `fault_refusal`)."""
    from hicache_diag.faults import FAULTS as FAULT_NAMES
    from hicache_diag.faults.catalog import catalog_text

    names = list(FAULT_NAMES)
    if engine_name is not None:
        refusal = engine(engine_name).options.fault_refusal
        names = [n for n in names if not refusal(FAULT_NAMES[n])]
    sys.stdout.write(catalog_text(names))
    raise typer.Exit(0)


def _list_faults_alone(p: Parsed) -> str | None:
    if not p.value(LIST_FAULTS):
        return None
    idle = [f for f in p.given_flags() if f not in (str(LIST_FAULTS), str(ENGINE))]
    if not idle:
        return None
    return (
        f"{LIST_FAULTS} prints the fault catalog and exits; it ignores {', '.join(idle)} "
        f"({ENGINE} keeps the faults that engine can run)"
    )


def _check_without_scenario(p: Parsed) -> str | None:
    if p.value(CHECK) and not p.given(SCENARIO) and not p.value(LIST_FAULTS):
        return f"{CHECK} needs {SCENARIO} FILE with an [expect] table"
    return None


# run's own input rules; the run options' are the options' (options/run_options.py, their
# engine's options class, options/no_effect.py), shared with bisect, hunt and shrink.
CHECKS = (
    Check("list-faults-with-run-flags", _list_faults_alone, warn=True),
    Check("check-without-scenario", _check_without_scenario),
)


# The checks run under a status line: with --engine sglang they probe the release and may build
# the model (seconds).
@with_run_flags
def run(
    ctx: typer.Context,
    json_: JsonOpt = False,
    list_faults: ListFaultsOpt = False,
    scenario: ScenarioOpt = None,
    engine_name: EngineOpt = None,
) -> None:
    """Run a real PP + HiCache runtime, inject faults, record evidence, give a verdict."""
    check(ctx, CHECKS)
    if list_faults:
        _list_faults(engine_name)
    with PhaseStatus(err_console, quiet=json_, first="checking the run"):
        options, expect = _checked_options(ctx, scenario)
        cfg = _placed(build(options))
    if expect is not None and expect.is_rate:
        raise typer.Exit(_check_rate_and_render(cfg, options, expect, json_))
    raise typer.Exit(_run_and_render(cfg, json_, expect))


def _checked_options(
    ctx: typer.Context, scenario: str | None
) -> tuple[RunOptions, Expectation | None]:
    """The run options (flags over the scenario) and, with --check, the scenario's [expect]."""
    scenario_file = load_scenario_file(scenario)
    expect = _expectation(scenario_file) if Parsed(ctx).value(CHECK) else None
    options = run_options(command_line(ctx), scenario_file)
    _refuse_lone_warm(getattr(options, "warm_server", False), expect)
    if expect is not None:
        expect.check_ranks(options.world_size, f"scenario {scenario!r}")
    return options, expect


def _placed(cfg: EngineConfig) -> EngineConfig:
    """--hosts: every host answers and shares the run dir's path, before anything starts."""
    return engine(cfg.engine).place(cfg)


def _refuse_lone_warm(warm_server: bool, expect: Expectation | None) -> None:
    if warm_server and not (expect is not None and expect.is_rate):
        raise UsageError(
            "--warm-server has no effect on one trial: it reuses a server across the trials of "
            "run --check on a scenario that states a rate (and of bisect and hunt)"
        )


def register(app: typer.Typer) -> None:
    app.command(
        "run",
        cls=configure(RunCommand),
        epilog=f"{EXAMPLES}\n\n{_catalogue()}",
        short_help="Run a PP + HiCache runtime, give a verdict.",
    )(run)


class RunCommand(PanelCommand):
    """`run`'s help: its options in panels."""


def _check_rate_and_render(
    cfg: EngineConfig, options: RunOptions, expect: Expectation, json_: bool
) -> int:
    """`run --check` on a scenario that states a rate: its trials, each in its own run dir
    under --out, then the table and the judged rate."""
    import time
    from pathlib import Path

    from hicache_diag.cli.render.bisect import trial_progress
    from hicache_diag.cli.render.rate_check import render_rate_check
    from hicache_diag.trials.rate_check import run_rate_check

    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = Path(options.out) if options.out else Path("runs") / f"check-{stamp}"
    progress, on_result = trial_progress(err_console, expect.trials, quiet=json_)
    with progress:
        entry = engine(cfg.engine)
        timeout, preload = type(options).trial_timeout_s, entry.preload
        warm = entry.warm if getattr(options, "warm_server", False) else None
        check = run_rate_check(cfg, expect, out, timeout, on_result, preload, warm)
    if json_:
        print_json(check.to_json())
    else:
        render_rate_check(err_console, check)
    return check.exit_code


def _run_and_render(cfg: EngineConfig, json_: bool, expect: Expectation | None = None) -> int:
    """One trial with the live view on stderr; the verdict as JSON (stdout) or a panel."""
    try:
        with LiveProgress(err_console, cfg.world_size, quiet=json_) as progress:
            progress.update({"phase": "starting", "elapsed_s": 0.0})  # from the first second
            argv = ["hicache-diag", *sys.argv[1:]]
            result = run_trial(cfg, argv, on_progress=progress.update)
    except KeyboardInterrupt:
        # Before the run directory existed (checks, imports): nothing was started or written.
        sys.stderr.write("hicache-diag: interrupted; nothing was left running\n")
        return 130
    if result.verdict.outcome is Outcome.INTERRUPTED:
        sys.stderr.write(
            f"hicache-diag: interrupted; every rank was reaped, {result.run_dir}/verdict.json "
            "written\n"
        )
    if json_:
        print_json(result.verdict.to_json())
    else:
        render_verdict(err_console, result.verdict)
    if expect is None:
        return int(result.verdict.exit_code)
    # --check: the scenario is a regression test; its exit status is the match, not the form.
    # A run that decided nothing is never a mismatch: it exits as it ended (3, 130).
    if (why := expect.undecided(result.verdict)) is not None:
        render_check(err_console, expect.describe(), [], undecided=why)
        return int(result.verdict.exit_code)
    mismatches = expect.mismatches(result.verdict)
    render_check(err_console, expect.describe(), mismatches)
    return int(ExitCode.CHECK_MISMATCH if mismatches else ExitCode.OK)
