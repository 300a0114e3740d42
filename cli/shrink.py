"""`hicache-diag shrink RUN_DIR`: the smallest fault schedule and request count that still fail
the way the run failed; writes the shrunk scenario and says what was removed."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer

from hicache_diag.cli.render.console import err_console, print_json
from hicache_diag.cli.run import JSON as RUN_JSON
from hicache_diag.errors import UsageError
from hicache_diag.options.params import field_param
from hicache_diag.options.run_options import RunOptions

EXAMPLES = """\b
Examples:
  hicache-diag shrink runs/form-a-run            # 2 fresh trials per candidate
  hicache-diag shrink RUN --trials 3 --budget 60 --json

Exit: 0 shrunk (or the failure did not reproduce: said so), 130 interrupted,
2 bad input. The shrunk scenario is shrunk.toml in --out."""

# The run's own output flags, not what it ran: each with the values it takes.
_DROP = {
    str(field_param(RunOptions, "out")): 1,
    str(RUN_JSON): 0,
    str(field_param(RunOptions, "check")): 0,
}


def run_argv(run_dir: Path) -> list[str]:
    """The `run` flags the run dir's manifest recorded (its output flags left out)."""
    from hicache_diag.evidence.paths import input_dir
    from hicache_diag.trials.rundir import read_manifest

    input_dir("RUN_DIR", str(run_dir))
    argv = list(read_manifest(run_dir).argv or [])
    if argv[1:2] != ["run"]:
        raise UsageError(f"{run_dir}: its manifest records no `hicache-diag run` command line")
    out, i = [], 2
    while i < len(argv):
        skip = _DROP.get(argv[i].split("=", 1)[0])
        i += 1 + (skip if skip is not None and "=" not in argv[i] else 0)
        if skip is None:
            out.append(argv[i - 1])
    return out


def _target(run_dir: Path):
    from hicache_diag import evidence as ev
    from hicache_diag.evidence.verdict import Outcome, Verdict
    from hicache_diag.shrink.shrink import KeptFailure

    try:
        verdict = Verdict.read(run_dir / ev.VERDICT)
    except (OSError, ValueError, KeyError, TypeError):
        raise UsageError(f"{run_dir}: no readable verdict.json to shrink toward") from None
    if verdict.outcome in (Outcome.OK, Outcome.UNDECIDED, Outcome.INTERRUPTED):
        raise UsageError(f"{run_dir} ended {verdict.outcome.value}: nothing to shrink")
    return KeptFailure(verdict.outcome.value, verdict.form.value if verdict.form else None)


def shrink(
    run_dir: Annotated[Path, typer.Argument(metavar="RUN_DIR", help="A failing run's dir.")],
    trials: Annotated[int, typer.Option("--trials", metavar="N", help="Trials a candidate.")] = 2,
    budget: Annotated[int, typer.Option("--budget", metavar="N", help="Trials in all.")] = 40,
    out: Annotated[str | None, typer.Option("--out", metavar="DIR", help="Shrink dir.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Shrink a failing run: drop faults, requests and fault steps while it still fails alike."""
    from hicache_diag.cli.render.shrink import render_shrink
    from hicache_diag.cli.run import options_from_argv
    from hicache_diag.options.limits import check_int
    from hicache_diag.shrink.shrink import shrink_run
    from hicache_diag.trials.rundir import check_writable

    check_int("--trials", trials, 1, 100)
    check_int("--budget", budget, trials, 10_000)
    target, argv = _target(run_dir), run_argv(run_dir)
    where = Path(out) if out else Path("runs") / f"shrink-{time.strftime('%Y%m%dT%H%M%SZ')}"
    check_writable(str(where))
    base = options_from_argv(argv)
    report = shrink_run(base, target, str(run_dir), where, trials, budget)
    _save(report, where, run_dir)
    if json_out:
        print_json(report.to_json())
    else:
        render_shrink(err_console, report)
    raise typer.Exit(130 if report.stopped == "interrupted" else 0)


def _save(report, where: Path, run_dir: Path) -> None:
    from hicache_diag.evidence.output_paths import write_atomic
    from hicache_diag.shrink.scenario_text import scenario_text
    from hicache_diag.shrink.shrink import SHRINK_JSON

    write_atomic(where / SHRINK_JSON, json.dumps(report.to_json(), indent=2) + "\n")
    if report.after is not None:
        header = f"shrunk from {run_dir} by hicache-diag shrink; removed:\n" + "\n".join(
            f"  {line}" for line in report.removed or ["nothing"]
        )
        write_atomic(where / "shrunk.toml", scenario_text(report.after, header))


def register(app: typer.Typer) -> None:
    app.command("shrink", epilog=EXAMPLES, short_help="Shrink a failing run's faults.")(shrink)
