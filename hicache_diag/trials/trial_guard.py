"""What keeps a run directory readable whatever ends the run (trials/trial.py): a full disk, an
I/O error, a stop signal at any point. The tool's own environment failing is never a rank's
fault: the verdict is `undecided`, names the cause (disk full, EIO) and no rank.

- `VerdictReserve`: a few KiB held in the run dir from the start and given back just before
  verdict.json is written, so a disk the ranks filled still has room for the verdict.
- `environment_error(exc)`: the OSErrors that are the machine's (ENOSPC, EIO, EDQUOT, EFBIG,
  EROFS), worded for the verdict; anything else is the tool's own bug and is raised.
- `environment_in_logs(run_dir)`: a rank that died of the same (its log's last error line).
- `signals_deferred()`: no stop signal lands inside a step that must not be cut in half (the
  run dir's creation, verdict.json's write); one that arrived meanwhile lands right after.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hicache_diag import evidence as ev
from hicache_diag.evidence import files
from hicache_diag.trials.signals import STOP_SIGNALS

RESERVE = ".verdict.reserve"
RESERVE_BYTES = 256 * 1024  # a verdict with its evidence lines is a few KiB; room to spare
_CAUSES = {
    errno.ENOSPC: "disk full",
    errno.EDQUOT: "disk quota exceeded",
    errno.EFBIG: "file size limit reached",
    errno.EIO: "I/O error",
    errno.EROFS: "file system became read-only",
}
# The same in a rank's log: Python's `OSError: [Errno 28] No space left on device`.
_LOG_CAUSE = re.compile(r"\[Errno (" + "|".join(str(e) for e in _CAUSES) + r")\]")


class VerdictReserve:
    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / RESERVE
        try:
            files.write_atomic(self.path, b"\0" * RESERVE_BYTES)
        except OSError:
            self.path.unlink(missing_ok=True)  # no room even now: the write below will say so

    def release(self) -> None:
        self.path.unlink(missing_ok=True)


def environment_error(exc: OSError, doing: str) -> str | None:
    """`exc` worded as the environment's failure (`disk full while writing launcher.json`), or
    None when it is not one (the caller raises it)."""
    cause = _CAUSES.get(exc.errno or 0)
    if cause is None:
        return None
    where = f" ({exc.filename})" if exc.filename else ""
    return f"{cause} while {doing}{where}: [Errno {exc.errno}] {exc.strerror}"


def environment_in_logs(run_dir: Path, ranks: list[int]) -> str | None:
    """The first of `ranks` whose log ends in an environment error (a rank that could not write
    its step file on a full disk), worded for the verdict."""
    for rank in ranks:
        try:
            tail = files.read_text(ev.rank_log(run_dir, rank), limit=64 * 1024)
        except (OSError, ValueError):
            continue
        m = _LOG_CAUSE.search(tail)
        if m:
            cause = _CAUSES[int(m.group(1))]
            return f"{cause}: rank {rank} could not write its evidence ([Errno {m.group(1)}])"
    return None


def disk_full(run_dir: Path) -> bool:
    """The run dir's file system has no room left (the ranks' writes fail silently then: their
    own log is on the same disk)."""
    try:
        st = os.statvfs(run_dir)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < 64 * 1024


@contextmanager
def signals_deferred(drop: bool = False) -> Iterator[list[int]]:
    """No stop signal interrupts the block (main thread): one that comes meanwhile is held and
    delivered as the block ends, or with `drop` discarded (the work it would have cut short is
    done: a table already printed). Held by swapping the handlers, not by a signal mask: a
    signal sent to the process lands on whichever thread does not mask it, and CPython runs
    its handler in the main thread all the same. Yields the list of the signals held."""
    if threading.current_thread() is not threading.main_thread():
        yield []
        return
    held: list[int] = []

    def hold(signum: int, frame: object) -> None:
        held.append(signum)

    old = {sig: signal.signal(sig, hold) for sig in STOP_SIGNALS}
    try:
        yield held
    finally:
        for sig, handler in old.items():
            if signal.getsignal(sig) is hold:  # unless the block installed its own since
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        if held and not drop:
            signal.raise_signal(held[-1])  # to the handler it was sent to meet
