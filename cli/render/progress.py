"""Live view of a running trial on stderr: step, queue depths and faults fired per rank."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

COLUMNS = ("rank", "step", "idle s", "wait", "run", "queues w/l/aw/al")


_QUEUES = ("write_queue", "load_queue", "ack_write_queue", "ack_load_queue")


def _faults_text(s: dict[str, Any]) -> str:
    by_name = s.get("faults") or {}
    if not by_name:
        return str(s.get("faults_fired", 0) or "-")
    return ", ".join(f"{name} x{n}" for name, n in sorted(by_name.items()))


def _row(rank: int, s: dict[str, Any]) -> list[str]:
    q = s.get("queues") or {}
    idle = s.get("idle_s")
    return [
        str(rank),
        str(s.get("step", "-")),
        "-" if idle is None else f"{idle:.1f}",
        str(s.get("num_waiting", 0)),
        str(s.get("num_running", 0)),
        "/".join(str(q.get(k, 0)) for k in _QUEUES),
        _faults_text(s),
    ]


def progress_table(snapshot: dict[str, Any]) -> Table | Text:
    """Step, seconds since the rank's last step (a hang grows here), queue depths and the faults
    fired so far, one row per rank; before any rank exists, the start-up phase (`phase`, with
    the seconds and the log to read)."""
    if "phase" in snapshot:
        log = f"  log: {snapshot['log']}" if snapshot.get("log") else ""
        return Text(f"{snapshot['phase']}  {snapshot.get('elapsed_s', 0.0):.0f} s{log}")
    t = Table(title=f"running  {snapshot.get('elapsed_s', 0.0):.1f} s", title_justify="left")
    for col in COLUMNS:
        t.add_column(col, justify="right", no_wrap=True)
    # The widest and most telling column: it folds at 80 columns instead of being cut off.
    t.add_column("faults fired", justify="left", overflow="fold", min_width=14, ratio=1)
    for rank, s in sorted(snapshot.get("ranks", {}).items()):
        t.add_row(*_row(rank, s))
    return t


class LiveProgress:
    """A rich Live table, only when stderr is a terminal and not --json (logs, pipes and CI get
    nothing)."""

    def __init__(self, console: Console, world_size: int, quiet: bool = False) -> None:
        self.console, self.world_size, self.quiet = console, world_size, quiet
        self._live: Live | None = None

    def __enter__(self) -> LiveProgress:
        if self.console.is_terminal and not self.quiet:  # quiet: --json
            self._live = Live(console=self.console, refresh_per_second=4, transient=True)
            self._live.__enter__()
        return self

    def update(self, snapshot: dict[str, Any]) -> None:
        if self._live is not None:
            self._live.update(progress_table(snapshot))

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)
