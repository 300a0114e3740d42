"""Path arguments checked at the boundary (CLI, run dir), before anything reads or starts: input
files must be regular files (a device or a FIFO would be read forever), folders must be folders,
outputs must be creatable (and never overwrite what a user owns: output_paths.py). Each refusal
is one line, exit 2."""

from __future__ import annotations

import errno
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


def name_fits(flag: str, path: str | os.PathLike) -> None:
    """Every component within the file system's name limit (NAME_MAX, 255 bytes on Linux) and
    the whole within PATH_MAX: else the one line here, not Errno 36 from wherever it is used."""
    raw = os.fsencode(path)
    try:
        limit = os.pathconf(_nearest_existing(Path(os.fsdecode(raw))), "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    longest = max((len(part) for part in raw.split(b"/")), default=0)
    if longest > limit:
        raise UsageError(
            f"{flag}: a name in {_shown(raw)} is {longest} bytes long; the file system "
            f"allows {limit}"
        )
    if len(raw) >= 4096:
        raise UsageError(f"{flag}: the path {_shown(raw)} is {len(raw)} bytes long; at most 4095")


def reachable(flag: str, path: str | os.PathLike) -> None:
    """An output path the kernel can follow: missing is fine (it is made), a symlink loop or a
    component that is a file is not (one line, instead of an error wherever it is first used)."""
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # the rest (missing, under a file) the callers word
            raise UsageError(f"{flag} {str(path)!r} cannot be used: {exc.strerror}") from None


def _shown(raw: bytes) -> str:
    text = os.fsdecode(raw)
    return repr(text if len(text) <= 80 else text[:60] + "..." + text[-16:])


def _nearest_existing(path: Path) -> Path:
    probe = Path(os.path.abspath(path))
    while probe != probe.parent:
        try:
            if probe.exists():
                return probe
        except OSError:
            pass
        probe = probe.parent
    return probe


def input_file(flag: str, path: str | os.PathLike | None, allow_stdin: bool = False) -> None:
    """An existing regular file (or `-`, stdin, where the command reads it)."""
    if path is None:
        return
    not_empty(flag, path)
    if allow_stdin and str(path) == "-":
        return
    name_fits(flag, path)
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
    name_fits(flag, path)
    p = Path(path)
    try:
        os.stat(p)
    except FileNotFoundError:
        if p.is_symlink():
            raise UsageError(f"{flag} {str(path)!r} is a broken symlink") from None
        raise UsageError(f"{flag} {str(path)!r} does not exist") from None
    except OSError as exc:  # a symlink loop (ELOOP), a component that is a file
        raise UsageError(f"{flag} {str(path)!r} cannot be read: {exc.strerror}") from None
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
    name_fits(flag, path)
    reachable(flag, path)
    p = Path(path)
    if p.exists() and not p.is_dir():
        kind = kind_of(p.stat().st_mode)
        raise UsageError(f"{flag} {str(path)!r} is {kind}; give a directory")
    parent_writable(flag, p)
