"""Outputs claimed under a lock: two invocations naming one output (`report --plots SAME` twice
at once, two `run --out D`) cannot both pass output_paths.py's checks and both write; the second
is refused in one line, naming the holder's pid.

The lock is flock(2) on a file per claimed path (its absolute, resolved name hashed) in a private
folder under the temporary directory, so nothing is left in the user's folders; it is held until
`release_all()` (the CLI calls it as each command ends) or the process exits, and the forked
children of the holder hold it with it. Standard library only.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
from pathlib import Path

from hicache_diag.errors import UsageError

_HELD: dict[str, tuple[int, Path]] = {}  # key -> (fd, lock file), this process's claims


def lock_dir() -> Path:
    """One private folder per user (0700: another user cannot plant or hold our locks)."""
    path = Path(tempfile.gettempdir()) / f"hicache-diag-locks-{os.geteuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def _key(path: Path) -> str:
    try:
        real = Path(os.path.abspath(path)).parent.resolve() / Path(path).name
    except (OSError, RuntimeError):
        real = Path(os.path.abspath(path))
    return str(real)


def claim(flag: str, path: str | os.PathLike) -> None:
    """Hold the lock of `path` (a file to write, or a folder written as a whole) or refuse:
    UsageError when another process holds it. Idempotent within one process."""
    key = _key(Path(path))
    if key in _HELD:
        return
    lock = lock_dir() / (hashlib.sha256(key.encode()).hexdigest()[:32] + ".lock")
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise UsageError(
                f"{flag} {str(path)!r} is being written by another hicache-diag{holder}; wait "
                "for it to finish, or give another path"
            ) from None
        if _same_file(fd, lock):
            break
        os.close(fd)  # released and unlinked between our open and our lock: take the new one
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n{key}\n".encode())
    _HELD[key] = (fd, lock)


def _holder(fd: int) -> str:
    try:
        pid = os.pread(fd, 32, 0).split(b"\n", 1)[0].decode().strip()
    except (OSError, UnicodeDecodeError):
        return ""
    return f" (pid {pid})" if pid.isdigit() else ""


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


def release_all() -> None:
    """Give back every claim of this process (unlinked first, then unlocked: a waiter that
    opened the old file sees it is gone and retries)."""
    for fd, lock in _HELD.values():
        try:
            lock.unlink(missing_ok=True)
        finally:
            os.close(fd)
    _HELD.clear()


def held() -> list[str]:
    return sorted(_HELD)
