"""`hicache-diag triage`: flags -> TriageRequest -> run_triage -> render or --json -> exit code."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated

import typer

from hicache_diag.cli.render.console import err_console, print_json
from hicache_diag.cli.render.log_progress import LogReadProgress
from hicache_diag.cli.render.triage import render_triage
from hicache_diag.cli.triage_cluster import (
    Container,
    Hosts,
    HostTimeout,
    JobId,
    Live,
    Namespace,
    Selector,
    SshConfig,
    Via,
    claim_save,
    no_local_inputs,
    reread_bundle,
    run_cluster,
    wanted,
)
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
    list[str] | None,
    typer.Option(
        "--dumps",
        metavar="DIR",
        help="Folder of py-spy dumps (text, --json, --native, bare frames) or faulthandler "
        "text (repeat per node).",
    ),
]
Logs = Annotated[
    list[str] | None,
    typer.Option(
        "--logs",
        metavar="FILE",
        help="Server log, as written or behind CRI / docker / journald / Loki / table prefixes, "
        "or a pasted traceback (repeat per node).",
    ),
]
FlightDumps = Annotated[
    list[str] | None,
    typer.Option(
        "--fr",
        metavar="DIR",
        help="Folder of PyTorch Flight Recorder dumps, one file per rank (pickle or JSON; "
        "docs/triage-framing.md).",
    ),
]
Save = Annotated[
    str | None,
    typer.Option("--save", metavar="DIR", help="Write the live samples here (merge with --dumps)."),
]


EXAMPLES = """\b
Examples:
  hicache-diag triage --discover          # every *::scheduler* process here
  hicache-diag triage --dumps samples/dumps/pp_hang_pp_sync --json
  hicache-diag triage --live --via ssh --hosts n1,n2   # every node at once

Exit: 0 healthy/busy, 10/11 form A/B, 12 hang, 16 other crash, 3 undecided,
130 interrupted, 2 bad input, 1 internal error."""


def _check_paths(dumps: list[str], logs: list[str], save: str | None) -> None:
    """Before anything is read: a device or FIFO would be read forever; '' is no path."""
    from hicache_diag.evidence.paths import input_dir, input_file

    for path in logs:
        input_file("--logs", path)
    for path in dumps:
        input_dir("--dumps", path)
    claim_save(save)


def _check_flight(folders: list[str]) -> None:
    from hicache_diag.evidence.paths import input_dir

    for path in folders:
        input_dir("--fr", path)


def _pid_max() -> int:
    try:
        return int(open("/proc/sys/kernel/pid_max").read())
    except (OSError, ValueError):
        return 2**22  # Linux's ceiling


def _check_request(req: TriageRequest) -> None:
    """Paths, live targets and sample counts, before any file is read or process dumped."""
    import psutil

    from hicache_diag.options.limits import MAX_SECONDS

    pid_max = _pid_max()
    gone = [p for p in req.pids if p > pid_max or not psutil.pid_exists(p)]
    if gone:
        raise UsageError(f"--pid {gone[0]}: no such process on this host")
    live = bool(req.pids or req.discover)
    if req.native and not live:
        raise UsageError("--native adds a live py-spy pass: use it with --pid or --discover")
    for flag, value in (("--interval", req.interval), ("--deadline", req.deadline_s)):
        if value > MAX_SECONDS:
            raise UsageError(f"{flag} must be <= {MAX_SECONDS:.0f} s (one day) (got {value})")
    most = int(MAX_SECONDS // (req.interval + req.deadline_s))
    if live and req.samples > most:
        raise UsageError(
            f"--samples {req.samples} x (--interval {req.interval} + --deadline "
            f"{req.deadline_s}) s is more than a day; the largest that fits is {most}"
        )


Interval = Annotated[
    float,
    typer.Option("--interval", metavar="SECONDS", help="Seconds between live samples."),
]
Samples = Annotated[
    int,
    typer.Option(
        "--samples", metavar="N", help="Live samples per rank (>= 2 tells progress from a wedge)."
    ),
]
Native = Annotated[bool, typer.Option("--native", help="Add a py-spy --native pass.")]
Deadline = Annotated[
    float,
    typer.Option("--deadline", metavar="SECONDS", help="Seconds allowed per dump pass."),
]
NumHeads = Annotated[
    int | None,
    typer.Option(
        "--num-heads", metavar="N", help="Local attention heads, to decode form A's sizes."
    ),
]
PpSize = Annotated[
    int | None,
    typer.Option(
        "--pp-size",
        metavar="N",
        help="The deployment's PP size, when the logs do not show PP prefixes.",
    ),
]
JsonOut = Annotated[bool, typer.Option("--json", help="Print hicache-diag/triage/v1.")]
MoreLogs = Annotated[
    list[str] | None,
    typer.Argument(help="Log files, as with --logs.", metavar="LOG", show_default=False),
]


def register(app: typer.Typer) -> None:
    app.command(
        "triage",
        epilog=EXAMPLES,
        short_help="Classify a hung or crashed cluster, name the culprit.",
    )(triage)


def triage(
    ctx: typer.Context,
    pid: Pids = None,
    discover: Discover = False,
    parent: Parent = None,
    dumps: Dumps = None,
    logs: Logs = None,
    fr: FlightDumps = None,
    save: Save = None,
    interval: Interval = 0.5,
    samples: Samples = 2,
    native: Native = False,
    deadline: Deadline = 5.0,
    num_heads: NumHeads = None,
    pp_size: PpSize = None,
    json_out: JsonOut = False,
    more_logs: MoreLogs = None,
    live: Live = False,
    via: Via = None,
    hosts: Hosts = None,
    jobid: JobId = None,
    selector: Selector = None,
    namespace: Namespace = None,
    container: Container = None,
    ssh_config: SshConfig = None,
    host_timeout: HostTimeout = 20.0,
) -> None:
    """Classify a hung or crashed cluster: crash vs hang, the culprit, where each rank waits."""
    cluster = {"via": via, "hosts": hosts, "jobid": jobid, "selector": selector}
    cluster |= {"namespace": namespace, "container": container, "ssh_config": ssh_config}
    judging = {"samples": samples, "num_heads": num_heads, "pp_size": pp_size}
    if wanted(live, *cluster.values()):
        no_local_inputs(pid, discover, dumps, logs, more_logs)
        opts = {"interval": interval, "deadline_s": deadline, "host_timeout_s": host_timeout}
        run_cluster(cluster, judging | opts | {"save": save}, json_out)
    _check_paths(dumps or [], [*(logs or []), *(more_logs or [])], save)
    _check_flight(fr or [])
    reread_bundle(dumps, [pid, discover, logs, more_logs, save], judging, json_out)
    progress = None if json_out else LogReadProgress(err_console)  # --json: quiet
    request = _request(ctx.params, progress)
    _check_request(request)
    with progress or contextlib.nullcontext():
        report = run_triage(request)
    if json_out:
        print_json(report.to_json())
    else:
        render_triage(report)
    raise typer.Exit(int(report.exit_code))


def _request(p: dict, progress: LogReadProgress | None) -> TriageRequest:
    """The local triage's request from the command's parsed parameters."""
    save = p["save"]
    return TriageRequest(
        pids=tuple(p["pid"] or ()),
        discover=p["discover"],
        parent=p["parent"],
        dumps=tuple(map(Path, p["dumps"] or ())),
        logs=tuple(map(Path, [*(p["logs"] or []), *(p["more_logs"] or [])])),
        save=None if save is None else Path(save),
        samples=p["samples"],
        interval=p["interval"],
        deadline_s=p["deadline"],
        native=p["native"],
        num_heads=p["num_heads"],
        pp_size=p["pp_size"],
        progress=progress,
        flight=tuple(map(Path, p["fr"] or ())),
    )
