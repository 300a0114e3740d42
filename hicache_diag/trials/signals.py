"""Signals around our processes: SIGINT, SIGTERM and SIGHUP read alike by the CLI (a Ctrl-C, a
supervisor's stop, a closed terminal or ssh session), so each reaps every process and still
writes what was found, as an interrupt does; and the parent-death signal every engine's
children set."""

from __future__ import annotations

import ctypes
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class StopSignal(KeyboardInterrupt):
    """A stop signal, raised where the main thread is: every `except KeyboardInterrupt` of the
    tool handles it as a Ctrl-C; `name` says which signal it was (the verdict's cause)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.name = signal.Signals(signum).name


_last: list[str] = []  # the signals received since `trap_sigterm`, in order


def _interrupt(signum: int, frame: object) -> None:
    _last.append(signal.Signals(signum).name)
    raise StopSignal(signum)


def last_signal() -> str | None:
    """The latest stop signal this process received (None: none since the trap)."""
    return _last[-1] if _last else None


def trap_sigterm() -> Any:
    """Make SIGINT, SIGTERM and SIGHUP raise StopSignal (a KeyboardInterrupt); the old
    handlers, or None where Python lets no handler be installed (off the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    if signal.getsignal(signal.SIGTERM) is not _interrupt:  # not nested in a trap of ours
        _last.clear()
    return {sig: signal.signal(sig, _interrupt) for sig in STOP_SIGNALS}


def restore_sigterm(old: Any) -> None:
    for sig, handler in (old or {}).items():
        signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


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
