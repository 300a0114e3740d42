"""Path arguments checked at the boundary (CLI, run dir), before anything reads or starts: input
files must be regular files (a device or a FIFO would be read forever), folders must be folders,
outputs must be creatable (and never overwrite what a user owns: output_paths.py). Each refusal
is one line, exit 2."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from hicache_diag.errors import UsageError


def kind_of(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "a file"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def not_empty(flag: str, value: str | os.PathLike | None) -> None:
    if value is not None and not str(value).strip():
        raise UsageError(f"{flag} '' is empty; give a path")


def input_file(flag: str, path: str | os.PathLike | None, allow_stdin: bool = False) -> None:
    """An existing regular file (or `-`, stdin, where the command reads it)."""
    if path is None:
        return
    not_empty(flag, path)
    if allow_stdin and str(path) == "-":
        return
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise UsageError(f"{flag} {str(path)!r} does not exist") from None
    except OSError as exc:
        raise UsageError(f"{flag} {str(path)!r} cannot be read: {exc.strerror}") from None
    if not stat.S_ISREG(mode):
        raise UsageError(f"{flag} {str(path)!r} is {kind_of(mode)}; give a regular file")
    if not os.access(path, os.R_OK):
        raise UsageError(f"{flag} {str(path)!r} is not readable")


def input_dir(flag: str, path: str | os.PathLike | None) -> None:
    """An existing, readable directory."""
    if path is None:
        return
    not_empty(flag, path)
    p = Path(path)
    if not p.exists():
        raise UsageError(f"{flag} {str(path)!r} does not exist")
    if not p.is_dir():
        kind = kind_of(p.stat().st_mode)
        raise UsageError(f"{flag} {str(path)!r} is {kind}; give a directory")
    if not os.access(p, os.R_OK | os.X_OK):
        raise UsageError(f"{flag} {str(path)!r} is not readable")


def parent_writable(flag: str, path: Path) -> None:
    probe = path
    while not probe.exists():
        if probe == probe.parent:
            break
        probe = probe.parent
    if not probe.is_dir():
        raise UsageError(f"{flag} {str(path)!r} is not writable: {probe} is a file")
    # Try it: os.access says yes to root even on /proc or a read-only mount.
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".hicache-diag-probe-", dir=probe))
    except OSError as exc:
        raise UsageError(f"{flag} {str(path)!r} is not writable: {exc.strerror}") from None


def output_dir(flag: str, path: str | os.PathLike | None) -> None:
    """A directory that exists or can be created, and can be written (a working folder such
    as the L3 storage dir; what a command writes for the user goes through output_paths.py)."""
    if path is None:
        return
    not_empty(flag, path)
    p = Path(path)
    if p.exists() and not p.is_dir():
        kind = kind_of(p.stat().st_mode)
        raise UsageError(f"{flag} {str(path)!r} is {kind}; give a directory")
    parent_writable(flag, p)
