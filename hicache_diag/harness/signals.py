"""SIGTERM read as Ctrl-C by the CLI's long commands (run, bisect): a supervisor's stop reaps
every process and still writes what was found, as an interrupt does."""

from __future__ import annotations

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


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    old = trap_sigterm()
    try:
        yield
    finally:
        restore_sigterm(old)
