"""One status line on stderr during a long wait (pdm/uv style): a spinner, what is happening,
the seconds so far. Only on a terminal and never with --json, so logs, pipes and CI get
nothing; the line is transient and leaves no trace once the wait is over."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

BIG_READ_BYTES = 16 * 1024**2  # smaller inputs are read in well under ~2 s: no status for them


class PhaseStatus:
    """`with PhaseStatus(console) as status: status.phase("loading the model")`."""

    def __init__(self, console: Console, quiet: bool = False, first: str = "") -> None:
        self.enabled = console.is_terminal and not quiet
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
            disable=not self.enabled,
        )
        self._task = self._progress.add_task(first, total=None)

    def phase(self, text: str) -> None:
        self._progress.update(self._task, description=text)

    def __enter__(self) -> PhaseStatus:
        self._progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._progress.__exit__(*exc)


def _size(path: os.PathLike | str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def reading_status(console: Console, paths: Iterable[os.PathLike | str], quiet: bool = False):
    """A status line while big inputs are read (a 150 MB log takes tens of seconds)."""
    paths = list(paths)
    total = sum(_size(p) for p in paths)
    quiet = quiet or total < BIG_READ_BYTES
    return PhaseStatus(console, quiet, f"reading {total / 1024**2:.0f} MB in {len(paths)} file(s)")
