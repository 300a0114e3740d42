"""A progress line on stderr while triage reads long logs: only on a terminal, only once a
read has taken a couple of seconds (short reads and pipes, CI, --json consumers see nothing)."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

SHOW_AFTER_S = 2.0


class LogReadProgress:
    """Callable as triage's `progress(bytes_read, bytes_total)`; a context manager that
    removes the line when the read is done."""

    def __init__(self, console: Console, show_after_s: float = SHOW_AFTER_S) -> None:
        self.console = console
        self.show_after_s = show_after_s
        self._t0 = time.monotonic()
        self._bar: Progress | None = None
        self._task: Any = None

    def __enter__(self) -> LogReadProgress:
        self._t0 = time.monotonic()
        return self

    def __call__(self, done: int, total: int) -> None:
        if not self.console.is_terminal:
            return
        if self._bar is None:
            if time.monotonic() - self._t0 < self.show_after_s:
                return
            self._bar = Progress(
                TextColumn("reading logs"),
                BarColumn(),
                DownloadColumn(),
                TimeRemainingColumn(),
                console=self.console,
                transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task("read", total=total or None)
        self._bar.update(self._task, completed=done, total=total or None)

    def __exit__(self, *exc: Any) -> None:
        if self._bar is not None:
            self._bar.stop()
