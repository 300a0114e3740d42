"""Live view of a running trial on stderr: step, queue depths and faults fired per rank."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table


def progress_table(snapshot: dict[str, Any]) -> Table:
    t = Table(title=f"running  {snapshot.get('elapsed_s', 0.0):.1f} s", title_justify="left")
    for col in (
        "rank",
        "step",
        "waiting",
        "running",
        "write_q",
        "load_q",
        "ack_w",
        "ack_l",
        "faults",
    ):
        t.add_column(col, justify="right")
    for rank, s in sorted(snapshot.get("ranks", {}).items()):
        q = s.get("queues") or {}
        t.add_row(
            str(rank),
            str(s.get("step", "-")),
            str(s.get("num_waiting", 0)),
            str(s.get("num_running", 0)),
            str(q.get("write_queue", 0)),
            str(q.get("load_queue", 0)),
            str(q.get("ack_write_queue", 0)),
            str(q.get("ack_load_queue", 0)),
            str(s.get("faults_fired", 0)),
        )
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
