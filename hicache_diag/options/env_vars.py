"""Every environment variable the tool reads, in one table, checked once when a command starts:
a value the tool cannot use is one line and exit 2 naming the variable and what it takes, never
a silent default and never a rank that dies of it later (the ranks read some of these too)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from hicache_diag.errors import UsageError

_ON, _OFF = ("1", "on", "true", "yes"), ("0", "off", "false", "no")


def _choice(*valid: str) -> Callable[[str], str | None]:
    def check(value: str) -> str | None:
        return None if value in valid else f"one of {', '.join(valid)}"

    return check


def _seconds(value: str) -> str | None:
    try:
        number = float(value)
    except ValueError:
        return "a number of seconds > 0"
    return None if math.isfinite(number) and number > 0 else "a number of seconds > 0"


def _switch(value: str) -> str | None:
    """Read as the recorders read it (evidence/recording.py `switch_state`), so a value the
    check passes is one every reader takes the same way (`OFF` is off everywhere)."""
    from hicache_diag.evidence.recording import switch_state

    return None if switch_state(value) is not None else f"one of {', '.join(_ON + _OFF)}"


def _directory(value: str) -> str | None:
    return "a directory (this path is a file)" if os.path.isfile(value) else None


def _job_id(value: str) -> str | None:
    # Slurm's job id, as srun --jobid takes it: a number (an array task: NUMBER_TASK)
    head, _, task = value.partition("_")
    ok = head.isdigit() and (not task or task.isdigit())
    return None if ok else "a Slurm job id (digits, or JOB_TASK for an array task)"


@dataclass(frozen=True, slots=True)
class EnvVar:
    name: str
    what: str
    check: Callable[[str], str | None]  # None: usable; else what it takes


ENV_VARS: tuple[EnvVar, ...] = (
    EnvVar("HICACHE_DIAG_RANK_START", "how builtin ranks start", _choice("fork", "spawn")),
    EnvVar("HICACHE_DIAG_TRIAL_START", "how bisect trials start", _choice("fork", "spawn")),
    EnvVar("HICACHE_DIAG_RECORD", "whether ranks record their steps", _switch),
    EnvVar("HICACHE_DIAG_RECORD_DIR", "where `record` puts each launch's session", _directory),
    EnvVar("HICACHE_DIAG_RECORD_CPU_SHIMS", "`record` loads the CPU shims", _switch),
    EnvVar("HICACHE_DIAG_SGLANG_READY_TIMEOUT", "seconds SGLang may take to serve", _seconds),
    EnvVar("HICACHE_DIAG_SGLANG_VENVS", "one venv per SGLang release", _directory),
    EnvVar("HICACHE_DIAG_SGLANG_RELEASES", "unzipped SGLang wheels by version", _directory),
    EnvVar("HICACHE_DIAG_CACHE", "the tool's cache", _directory),
    EnvVar("XDG_CACHE_HOME", "the tool's cache is XDG_CACHE_HOME/hicache-diag", _directory),
    EnvVar("SLURM_JOB_ID", "the job triage --live and bisect --via slurm step into", _job_id),
)
PREFIX = "HICACHE_DIAG_"
# Set by the tool for its own rank and plugin processes: a value given here is overwritten.
INTERNAL = (
    "HICACHE_DIAG_PLUGIN_CONFIG",
    "HICACHE_DIAG_LAUNCHER_PID",
    "HICACHE_DIAG_LAUNCHED_AT",
    "HICACHE_DIAG_RANK",
    "HICACHE_DIAG_RECORD_SESSION",  # `record`: named by a launch's first process
)
# Read by the test suite and benches, not by the tool.
TESTS_ONLY = ("HICACHE_DIAG_SGLANG_SRC", "HICACHE_DIAG_TEST_CRASH")


def check_environment(environ: Mapping[str, str] | None = None) -> None:
    """Each set variable of the table, checked; the first unusable one is a UsageError."""
    environ = os.environ if environ is None else environ
    for var in ENV_VARS:
        value = environ.get(var.name)
        if not value:  # unset and empty read alike everywhere
            continue
        want = var.check(value)
        if want:
            raise UsageError(f"{var.name}={value!r} ({var.what}) must be {want}")


def environment_warnings(environ: Mapping[str, str] | None = None) -> list[str]:
    """A HICACHE_DIAG_* variable the tool does not read (a typo) or sets itself: ignored, and
    said so by name, never silently."""
    environ = os.environ if environ is None else environ
    known = {v.name for v in ENV_VARS} | set(TESTS_ONLY)
    out = []
    for name in sorted(n for n in environ if n.startswith(PREFIX) and n not in known):
        if name in INTERNAL:
            out.append(f"{name} is set by hicache-diag for its own processes; ignored here")
        else:
            out.append(f"{name} is not a variable hicache-diag reads; ignored")
    return out


def switch_on(value: str | None, default: bool = True) -> bool:
    """A checked on/off variable's value."""
    if value is None or not value.strip():
        return default
    return value.strip().lower() in _ON
