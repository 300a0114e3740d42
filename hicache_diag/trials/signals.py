"""Signals around our processes: SIGTERM read as Ctrl-C by the CLI's long commands (run,
bisect), so a supervisor's stop reaps every process and still writes what was found, as an
interrupt does; and the parent-death signal every engine's children set."""

from __future__ import annotations

import ctypes
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def trap_sigterm() -> Any:
    """Make SIGTERM raise KeyboardInterrupt; the old handler, or None where Python lets no
    handler be installed (off the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _interrupt)


def restore_sigterm(old: Any) -> None:
    if old is not None:
        signal.signal(signal.SIGTERM, old)


PR_SET_PDEATHSIG = 1


def die_with_parent() -> bool:
    """In a child (before exec, or first thing in a rank): SIGKILL when its parent dies, even by
    SIGKILL (no cleanup runs then), as SGLang's kill_itself_when_parent_died does. False where
    prctl is not there (not Linux)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return False
    return True


def signal_group(pgid: int, sig: int) -> bool:
    """`sig` to a process group we started (start_new_session); False once it is gone."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    old = trap_sigterm()
    try:
        yield
    finally:
        restore_sigterm(old)
