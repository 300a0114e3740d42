"""`hicache-diag hunt`: a release's unaligned per-rank reads -> trials that try to make them
diverge -> a table per trigger (docs/design.md §10)."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Annotated

import typer

from hicache_diag.cli.render.console import err_console, print_json
from hicache_diag.errors import UsageError

EXAMPLES = """\b
Examples:
  hicache-diag hunt --budget 60m                      # the SGLang of this Python
  hicache-diag hunt --release 0.5.23 --trigger session-close --trials 5
  hicache-diag hunt --engine builtin --protocol legacy --trials 2 --budget 12

Any other `run` flag applies to every trial. Exit: 0 hunt finished (whatever it
found; hunt.json in --out), 130 interrupted (partial table), 2 bad input."""

_BUDGET = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*$")


def parse_budget(text: str | None) -> tuple[int | None, float | None]:
    """`20` trials, or `45s` / `60m` / `2h` of wall time."""
    if text is None:
        return None, None
    m = _BUDGET.match(text)
    if not m or float(m.group(1)) <= 0:
        raise UsageError(f"--budget {text!r}: give trials (e.g. 20) or a time (45s, 60m, 2h)")
    number, unit = float(m.group(1)), m.group(2)
    if not unit:
        if number != int(number):
            raise UsageError(f"--budget {text!r}: a number of trials is whole")
        return int(number), None
    return None, number * {"s": 1, "m": 60, "h": 3600}[unit]


def _release_args(release: str | None, passed: list[str]) -> list[str]:
    """`--release V`: this Python when its SGLang is V, else the venv that holds V (it picks
    the engine and the interpreter: refused beside a pass-through flag that picks either)."""
    if release is None:
        return []
    from hicache_diag.cli.run_flags import ENGINE
    from hicache_diag.engines.registry import release_engine
    from hicache_diag.options.params import field_param

    entry = release_engine()
    python_flag = str(field_param(entry.options, "sglang_python"))
    for flag in (str(ENGINE), python_flag):
        if any(a == flag or a.startswith(flag + "=") for a in passed):
            raise UsageError(f"--release {release} picks SGLang's engine and Python; drop {flag}")
    python = entry.releases.venv_python(release)
    if python is None:
        try:
            if entry.releases.probe(None, python_flag) == release:
                return [str(ENGINE), entry.name]
        except UsageError:
            pass
        command = entry.releases.install_command(release)
        raise UsageError(f"--release {release} is not held here; {command}")
    return [str(ENGINE), entry.name, python_flag, python]


def hunt(
    ctx: typer.Context,
    release: Annotated[
        str | None, typer.Option("--release", metavar="V", help="SGLang release to hunt in.")
    ] = None,
    trials: Annotated[int, typer.Option("--trials", metavar="N", help="Trials per trigger.")] = 3,
    budget: Annotated[
        str | None, typer.Option("--budget", metavar="N|60m", help="Trials, or wall time.")
    ] = None,
    out: Annotated[str | None, typer.Option("--out", metavar="DIR", help="Hunt directory.")] = None,
    trigger: Annotated[
        list[str] | None,
        typer.Option("--trigger", metavar="NAME", help="Only this trigger (repeatable)."),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Run trials against each unaligned per-rank read of a release: natural triggers first,
    physical perturbations after; a divergence is confirmed on a fresh rerun and exported."""
    from hicache_diag.cli.render.bisect import trial_progress
    from hicache_diag.cli.render.hunt import render_hunt
    from hicache_diag.cli.run import options_from_argv
    from hicache_diag.hunt.session import plan_session, save_report

    budget_trials, budget_s = parse_budget(budget)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    where = Path(out) if out else Path("runs") / f"hunt-{stamp}"
    base = options_from_argv([*_release_args(release, ctx.args), *ctx.args])
    session = plan_session(base, trials, budget_trials, budget_s, where, tuple(trigger or ()))
    progress, on_result = trial_progress(err_console, session.planned_trials, quiet=json_out)
    with progress:
        report = session.run(on_result)
    save_report(report, where)
    if json_out:
        print_json(report.to_json())
    else:
        render_hunt(err_console, report)
    raise typer.Exit(130 if report.interrupted else 0)


def register(app: typer.Typer) -> None:
    app.command(
        "hunt",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
        epilog=EXAMPLES,
        short_help="Hunt a release's unaligned reads for divergences.",
    )(hunt)
