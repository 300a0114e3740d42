"""`hicache-diag triage`: flags -> TriageRequest -> run_triage -> render or --json -> exit code."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hicache_diag.cli.render.console import err_console, print_json
from hicache_diag.cli.render.log_progress import LogReadProgress
from hicache_diag.cli.render.triage import render_triage
from hicache_diag.errors import UsageError
from hicache_diag.triage import TriageRequest, run_triage

Pids = Annotated[
    list[int] | None,
    typer.Option("--pid", metavar="PID", help="Scheduler PID; repeat for several ranks."),
]
Discover = Annotated[
    bool,
    typer.Option(
        "--discover", help="Dump every sglang::scheduler* / hicache-diag::scheduler* process."
    ),
]
Parent = Annotated[
    int | None,
    typer.Option("--parent", metavar="PID", help="With --discover: only this launcher's tree."),
]
Dumps = Annotated[
    list[Path] | None,
    typer.Option(
        "--dumps",
        metavar="DIR",
        help="Folder of py-spy dumps (text, --json, --native, bare frames) or faulthandler "
        "text (repeat per node).",
    ),
]
Logs = Annotated[
    list[Path] | None,
    typer.Option(
        "--logs",
        metavar="FILE",
        help="Server log, as written or behind CRI / docker / journald / Loki / table prefixes, "
        "or a pasted traceback (repeat per node).",
    ),
]
Save = Annotated[
    Path | None,
    typer.Option("--save", metavar="DIR", help="Write the live samples here (merge with --dumps)."),
]


EXAMPLES = """\b
Examples:
  hicache-diag triage --discover          # every *::scheduler* process here
  hicache-diag triage --dumps samples/dumps/pp_hang_pp_sync --json
  hicache-diag triage --logs samples/logs/form_a_cascade.log"""


def register(app: typer.Typer) -> None:
    @app.command(
        "triage",
        epilog=EXAMPLES,
        short_help="Classify a hung or crashed cluster, name the culprit.",
    )
    def _triage(
        pid: Pids = None,
        discover: Discover = False,
        parent: Parent = None,
        dumps: Dumps = None,
        logs: Logs = None,
        save: Save = None,
        interval: Annotated[
            float,
            typer.Option("--interval", metavar="SECONDS", help="Seconds between live samples."),
        ] = 0.5,
        samples: Annotated[
            int,
            typer.Option(
                "--samples",
                metavar="N",
                help="Live samples per rank (>= 2 tells progress from a wedge).",
            ),
        ] = 2,  # fmt: skip
        native: Annotated[
            bool, typer.Option("--native", help="Add a py-spy --native pass.")
        ] = False,
        deadline: Annotated[
            float,
            typer.Option("--deadline", metavar="SECONDS", help="Seconds allowed per dump pass."),
        ] = 5.0,
        num_heads: Annotated[
            int | None,
            typer.Option(
                "--num-heads", metavar="N", help="Local attention heads, to decode form A's sizes."
            ),
        ] = None,
        pp_size: Annotated[
            int | None,
            typer.Option(
                "--pp-size",
                metavar="N",
                help="The deployment's PP size, when the logs do not show PP prefixes.",
            ),
        ] = None,
        json_out: Annotated[bool, typer.Option("--json", help="Print hicache-diag/triage/v1.")] = (
            False
        ),
        more_logs: Annotated[
            list[Path] | None,
            typer.Argument(
                help="More log files after --logs FILE.", metavar="[FILE...]", hidden=True
            ),
        ] = None,
    ) -> None:
        """Classify a hung or crashed cluster: crash vs hang, the culprit, where each rank waits.

        Exit: 0 healthy/busy, 10/11 form A/B, 12 hang, 16 other crash, 3 undecided, 2 bad input."""
        if more_logs and not logs:
            raise UsageError(f"unexpected argument {more_logs[0]} (log files go after --logs)")
        progress = LogReadProgress(err_console)
        request = TriageRequest(
            pids=tuple(pid or ()),
            discover=discover,
            parent=parent,
            dumps=tuple(dumps or ()),
            logs=tuple(logs or ()) + tuple(more_logs or ()),
            save=save,
            samples=samples,
            interval=interval,
            deadline_s=deadline,
            native=native,
            num_heads=num_heads,
            pp_size=pp_size,
            progress=progress,
        )
        with progress:
            report = run_triage(request)
        if json_out:
            print_json(report.to_json())
        else:
            render_triage(report)
        raise typer.Exit(int(report.exit_code))
