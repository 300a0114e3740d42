"""`hicache-diag record`: a server the user launches, recorded for triage. Wraps the user's own
command (`record -- python -m sglang.launch_server ...`), which is exec'd in this process's
place: its pid, signals and exit code stay the user's (Slurm and supervisors see their own
process). `--print-env` prints the same environment for a manifest that cannot wrap the command
(Kubernetes, systemd)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from hicache_diag.cli.render.console import print_json
from hicache_diag.cli.render.record import export_lines, manifest
from hicache_diag.engines.registry import record_setup
from hicache_diag.errors import UsageError
from hicache_diag.evidence.recording_files import (
    CPU_SHIMS_ENV,
    SESSION_ENV,
    SWITCH_ENV,
    session_name,
    switch_state,
)

EXAMPLES = """\b
Examples:
  hicache-diag record -- python -m sglang.launch_server --pp-size 2
  srun hicache-diag record --dir /shared/rec -- python -m sglang.launch_server
  hicache-diag record --print-env --dir /rec --bundle-dir /opt/rec --json

Each launch writes one session folder under DIR; `triage` reads them. The
recorder runs in SGLang's own processes: no listener, bounded files (0600),
off for a rank (said once in its log) on any error of its own.
HICACHE_DIAG_RECORD=0 turns it off.

Exit: 0 --print-env printed, else the command's own (it replaces this
process); 2 bad input, 1 internal error."""


def record(
    command: Annotated[
        list[str] | None,
        typer.Argument(metavar="COMMAND", help="The server's own command line, after --."),
    ] = None,
    record_dir: Annotated[
        Path | None,
        typer.Option(
            "--dir",
            metavar="DIR",
            help="Where each launch's session folder goes.  [default: the tool's cache "
            "dir, recordings/]",
        ),
    ] = None,
    print_env: Annotated[
        bool, typer.Option("--print-env", help="Print the variables that load the recorder.")
    ] = False,
    bundle_dir: Annotated[
        Path | None,
        typer.Option(
            "--bundle-dir", metavar="DIR", help="Copy the recorder (plain files) here; name it."
        ),
    ] = None,
    cpu_shims: Annotated[
        bool,
        typer.Option("--cpu-shims", help="Also load the plugin's CPU shims (a CPU-only host)."),
    ] = False,
    json_out: Annotated[
        bool, typer.Option("--json", help="With --print-env: a JSON manifest.")
    ] = False,
) -> None:
    """Record every rank of a server you launch (any SGLang 0.5.12.post1-0.5.23, GPU or CPU),
    for triage: per-step decisions, digests for the server's whole life, and in-process dumps
    on SGLang's watchdog, an exception, a consensus mismatch, triage's request or SIGUSR2.
    docs/record.md."""
    if json_out and not print_env:
        raise UsageError("--json goes with --print-env")
    if print_env and command:
        raise UsageError("--print-env prints the environment; it runs no command: drop one")
    if not print_env and not command:
        raise UsageError("record needs the command to run after `--` (or --print-env)")
    setup = record_setup(record_dir, bundle_dir, cpu_shims)
    if print_env:
        if json_out:
            print_json(manifest(setup))
        else:
            sys.stdout.write(export_lines(setup))
        return
    assert command is not None
    _exec(command, _environ(setup))


def _environ(setup) -> dict[str, str]:
    if switch_state(os.environ.get(SWITCH_ENV)) is False:
        if CPU_SHIMS_ENV not in setup.variables:
            _warn(f"{SWITCH_ENV} is off: running the command without the recorder")
            return dict(os.environ)
        _warn(f"{SWITCH_ENV} is off: running the command with the CPU shims alone")
        return setup.environ(os.environ)  # the plugin reads the switch: shims, nothing else
    try:
        setup.record_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:  # the server runs regardless; its ranks say they are off
        _warn(f"record dir {setup.record_dir}: {exc.strerror or exc}; ranks will record nothing")
    env = setup.environ(os.environ)
    env[SESSION_ENV] = session_name(os.getpid())  # this pid is the command's after the exec
    return env


def _exec(command: list[str], env: dict[str, str]) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:  # not found, not executable: nothing was started
        raise UsageError(f"cannot run {command[0]!r}: {exc.strerror or exc}") from None


def _warn(message: str) -> None:
    sys.stderr.write(f"hicache-diag: warning: {message}\n")


def register(app: typer.Typer) -> None:
    app.command(
        "record",
        epilog=EXAMPLES,
        short_help="Record a server you launch, for triage.",
        context_settings={"allow_interspersed_args": False},
    )(record)
