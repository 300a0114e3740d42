"""Hang watch (ours): from the first step on, no rank writes a jsonl line for `hang_timeout`
seconds => hang. Before any rank has stepped, start-up has its own grace, bounded by
`startup_grace()`; a rank the kernel shows stopped (SIGSTOP) for `hang_timeout` is a hang even
then, since a stopped process cannot finish starting.

It also tails each rank's jsonl for the live progress view, so the files are read once.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Before its first line a rank imports torch (spawn only; a fork has it), joins gloo and builds
# its caches: ~0.1 s forked, 1.5-3 s spawned, measured up to ~6 s spawned on a loaded 2-core box
# (bench/startup.py). Start-up gets this bound, or the hang timeout when that is longer.
STARTUP_GRACE_S = 15.0


def startup_grace(hang_timeout: float) -> float:
    return max(STARTUP_GRACE_S, hang_timeout)


@dataclass
class RankTail:
    path: Path
    last_change: float
    offset: int = 0
    last: dict[str, Any] | None = None
    first_seen: float | None = None  # when its first step line was read
    faults_fired: int = 0
    fault_counts: dict[str, int] = field(default_factory=dict)  # fault name -> times fired
    _partial: bytes = b""

    def poll(self, now: float) -> None:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except FileNotFoundError:
            return
        if not data:
            return
        self.offset += len(data)
        self.last_change = now
        if self.first_seen is None:
            self.first_seen = now
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            if line.strip():
                rec = json.loads(line)
                self._count_faults(rec.get("faults_fired") or ())
                self.last = rec

    def _count_faults(self, fired: Any) -> None:
        for f in fired:
            name = f.get("fault", "?") if isinstance(f, dict) else str(f)
            self.fault_counts[name] = self.fault_counts.get(name, 0) + 1
            self.faults_fired += 1


@dataclass
class HangWatch:
    run_dir: Path
    world_size: int
    hang_timeout: float
    started: float = field(default_factory=time.time)
    tails: dict[int, RankTail] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for r in range(self.world_size):
            self.tails[r] = RankTail(self.run_dir / f"rank{r}.jsonl", last_change=self.started)

    def poll(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        for tail in self.tails.values():
            tail.poll(now)

    @property
    def stepped(self) -> bool:
        return any(t.first_seen is not None for t in self.tails.values())

    def stalled(self, now: float | None = None) -> bool:
        """From the first step on: no rank wrote a line for the hang timeout. Before it: the
        start-up grace ran out."""
        now = time.time() if now is None else now
        if not self.stepped:
            return now - self.started > startup_grace(self.hang_timeout)
        last = max(t.last_change for t in self.tails.values() if t.first_seen is not None)
        return now - last > self.hang_timeout

    def startup_s(self) -> dict[str, float | None]:
        """Seconds from launch to each rank's first step line (None: it never stepped)."""
        return {
            str(r): None if t.first_seen is None else round(t.first_seen - self.started, 3)
            for r, t in self.tails.items()
        }

    def last_steps(self) -> dict[str, Any]:
        """Per rank: its last recorded step and that line's own time (the rank's clock)."""
        return {
            str(r): {"step": (t.last or {}).get("step"), "t": (t.last or {}).get("t")}
            for r, t in self.tails.items()
        }

    def last_progress(self) -> dict[str, float]:
        return {str(r): t.last_change for r, t in self.tails.items()}

    def snapshot(self) -> dict[int, dict[str, Any]]:
        """Per rank: last step, queue depths, faults fired so far (total and by name) and how
        long ago the rank last wrote a step (for the live view)."""
        now = time.time()
        out = {}
        for r, t in self.tails.items():
            rec = t.last or {}
            out[r] = {
                "step": rec.get("step"),
                "queues": rec.get("queues", {}),
                "num_waiting": rec.get("num_waiting", 0),
                "num_running": rec.get("num_running", 0),
                "faults_fired": t.faults_fired,
                "faults": dict(t.fault_counts),
                "idle_s": max(0.0, now - t.last_change) if t.last is not None else None,
            }
        return out
