"""`hicache-diag triage`: flags -> its checks (cli/triage_flags.py) -> TriageRequest ->
run_triage -> render or --json -> exit code."""

from __future__ import annotations

import contextlib
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from hicache_diag.cli.params import check, flag
from hicache_diag.cli.render.console import err_console, print_json
from hicache_diag.cli.render.log_progress import LogReadProgress
from hicache_diag.cli.render.triage import render_triage
from hicache_diag.cli.triage_cluster import reread_bundle, run_cluster, wanted
from hicache_diag.cli.triage_flags import (
    CHECKS,
    CONTAINER,
    DEADLINE,
    DISCOVER,
    DUMPS,
    FLIGHT,
    HOST_TIMEOUT,
    INTERVAL,
    JOBID,
    JSON,
    LIVE,
    LOGS,
    NAMESPACE,
    NATIVE,
    NUM_HEADS,
    PARENT,
    PID,
    PP,
    RECORD_DIR,
    SAMPLES,
    SAVE,
    SELECTOR,
)
from hicache_diag.options.params import HOSTS, SSH_CONFIG, VIA
from hicache_diag.triage import TriageRequest, run_triage

Pids = flag(PID, list[int] | None)
Discover = flag(DISCOVER, bool)
Parent = flag(PARENT, int | None)
Dumps = flag(DUMPS, list[str] | None)
Logs = flag(LOGS, list[str] | None)
Save = flag(SAVE, str | None)
RecordDirs = flag(RECORD_DIR, list[str] | None)
FlightDumps = flag(FLIGHT, list[str] | None)
Interval = flag(INTERVAL, float)
Samples = flag(SAMPLES, int)
Native = flag(NATIVE, bool)
Deadline = flag(DEADLINE, float)
NumHeads = flag(NUM_HEADS, int | None)
Pp = flag(PP, int | None)
PpOld = Annotated[int | None, typer.Option(*PP.deprecated, hidden=True)]
JsonOut = flag(JSON, bool)
MoreLogs = Annotated[
    list[str] | None,
    typer.Argument(help="Log files, as with --logs.", metavar="LOG", show_default=False),
]
Live = flag(LIVE, bool)
Via = flag(VIA, str | None)
Hosts = flag(HOSTS, str | None)
JobId = flag(JOBID, str | None)
Selector = flag(SELECTOR, str | None)
Namespace = flag(NAMESPACE, str | None)
Container = flag(CONTAINER, str | None)
SshConfig = flag(SSH_CONFIG, str | None)
HostTimeout = flag(HOST_TIMEOUT, float)


EXAMPLES = """\b
Examples:
  hicache-diag triage --discover          # every *::scheduler* process here
  hicache-diag triage --dumps samples/dumps/pp_hang_pp_sync --json
  hicache-diag triage --live --via ssh --hosts n1,n2   # every node at once

Exit: 0 healthy/busy, 10/11 form A/B, 12 hang, 16 other crash, 3 undecided,
130 interrupted, 2 bad input, 1 internal error."""


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
    record_dir: RecordDirs = None,
    fr: FlightDumps = None,
    save: Save = None,
    interval: Interval = 0.5,
    samples: Samples = 2,
    native: Native = False,
    deadline: Deadline = 5.0,
    num_heads: NumHeads = None,
    pp: Pp = None,
    pp_size: PpOld = None,
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
    pp = _pp(pp, pp_size)
    check(ctx, CHECKS)
    cluster = {"via": via, "hosts": hosts, "jobid": jobid, "selector": selector}
    cluster |= {"namespace": namespace, "container": container, "ssh_config": ssh_config}
    judging = {"samples": samples, "num_heads": num_heads, "pp_size": pp}
    if wanted(live, *cluster.values()):
        opts = {"interval": interval, "deadline_s": deadline, "host_timeout_s": host_timeout}
        run_cluster(cluster, judging | opts | {"save": save}, json_out)
    reread_bundle(dumps, [pid, discover, logs, more_logs, save, record_dir], judging, json_out)
    progress = None if json_out else LogReadProgress(err_console)  # --json: quiet
    found = tuple(map(Path, [*(logs or []), *(more_logs or [])]))
    saved = None if save is None else Path(save)
    pids, folders = tuple(pid or ()), tuple(map(Path, dumps or ()))
    request = TriageRequest(pids, discover, parent, folders, found, saved, samples, interval)
    request = replace(request, deadline_s=deadline, native=native, num_heads=num_heads)
    request = replace(request, record_dirs=tuple(map(Path, record_dir or ())))
    request = replace(request, flight=tuple(map(Path, fr or ())))
    _report(replace(request, pp_size=pp, progress=progress), json_out)


def _report(request: TriageRequest, json_out: bool) -> None:
    with request.progress or contextlib.nullcontext():
        report = run_triage(request)
    if json_out:
        print_json(report.to_json())
    else:
        render_triage(report)
    raise typer.Exit(int(report.exit_code))


def _pp(pp: int | None, old: int | None) -> int | None:
    """--pp, or its old spelling --pp-size (one warning line)."""
    if old is None:
        return pp
    from hicache_diag.cli.params import warn

    warn(f"{PP.deprecated[0]} is deprecated: use {PP}")
    return old if pp is None else pp
