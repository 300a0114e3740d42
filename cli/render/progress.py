"""Live view of a running trial on stderr: step, queue depths and faults fired per rank."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

COLUMNS = ("rank", "step", "idle s", "waiting", "running", "write_q", "load_q", "ack_w", "ack_l")


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
        *(str(q.get(k, 0)) for k in ("write_queue", "load_queue", "ack_write_queue")),
        str(q.get("ack_load_queue", 0)),
        _faults_text(s),
    ]


def progress_table(snapshot: dict[str, Any]) -> Table:
    """Step, seconds since the rank's last step (a hang grows here), queue depths and the faults
    fired so far, one row per rank."""
    t = Table(title=f"running  {snapshot.get('elapsed_s', 0.0):.1f} s", title_justify="left")
    for col in COLUMNS:
        t.add_column(col, justify="right")
    t.add_column("faults fired", justify="left")
    for rank, s in sorted(snapshot.get("ranks", {}).items()):
        t.add_row(*_row(rank, s))
    return t


class LiveProgress:
    """A rich Live table, only when stderr is a terminal (logs and CI get nothing)."""

    def __init__(self, console: Console, world_size: int) -> None:
        self.console, self.world_size = console, world_size
        self._live: Live | None = None

    def __enter__(self) -> LiveProgress:
        if self.console.is_terminal:
            self._live = Live(console=self.console, refresh_per_second=4, transient=True)
            self._live.__enter__()
        return self

    def update(self, snapshot: dict[str, Any]) -> None:
        if self._live is not None:
            self._live.update(progress_table(snapshot))

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)
