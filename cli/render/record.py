"""`hicache-diag record --print-env`: the variables as shell `export` lines, or as a manifest's
JSON (a Kubernetes container's `env:` list among it)."""

from __future__ import annotations

import shlex
from typing import Any

from hicache_diag.evidence.recording_files import (
    DUMP_REQUEST,
    DUMP_SIGNAL,
    SESSION_ENV,
    SWITCH_ENV,
)


def export_lines(setup: Any) -> str:
    """One `export` a variable; PYTHONPATH keeps what the shell already has, after the bundle."""
    lines = []
    for name, value in setup.variables.items():
        if name == "PYTHONPATH":
            lines.append(f'export PYTHONPATH={shlex.quote(value)}"${{PYTHONPATH:+:$PYTHONPATH}}"')
        else:
            lines.append(f"export {name}={shlex.quote(value)}")
    return "\n".join(lines) + "\n"


def manifest(setup: Any) -> dict[str, Any]:
    return {
        "env": dict(setup.variables),
        "env_list": [{"name": k, "value": v} for k, v in setup.variables.items()],
        "pythonpath": "prepend: the bundle's two folders go before any PYTHONPATH the image has",
        "bundle": str(setup.bundle),
        "record_dir": str(setup.record_dir),
        "session": f"{SESSION_ENV}: named by the launch's first process; leave it unset",
        "switch": f"{SWITCH_ENV}=0 (or off, false, no) turns recording off",
        "dump_signal": DUMP_SIGNAL,
        "dump_request": DUMP_REQUEST,
    }
