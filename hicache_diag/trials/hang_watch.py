"""Hang watch (ours): from the first step on, no rank writes a jsonl line for `hang_timeout`
seconds => hang. Before any rank has stepped, start-up has its own grace, bounded by
`startup_grace()`; a rank the kernel shows stopped (SIGSTOP) for `hang_timeout` is a hang even
then, since a stopped process cannot finish starting.

It also tails each rank's jsonl for the live progress view, so the files are read once. An
engine says which lines count as progress (`busy`: SGLang's plugin also writes idle steps) and
may report progress the step files cannot show (`note_activity`: a request answered).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hicache_diag.evidence import rank_jsonl

# Before its first line a rank imports torch (spawn only; a fork has it), joins gloo and builds
# its caches: ~0.1 s forked, 1.5-3 s spawned, measured up to ~6 s spawned on a loaded 2-core box
# (bench/startup.py). Start-up gets this bound, or the hang timeout when that is longer.
STARTUP_GRACE_S = 15.0


def startup_grace(hang_timeout: float) -> float:
    return max(STARTUP_GRACE_S, hang_timeout)


# The shortest silence the watch can tell from a rank between two steps: it reads the step files
# every poll (engine.poll_s), and a busy rank's step, a reaping or the last outputs take up to
# about a second on a loaded 2-core box. A --hang-timeout under this measured the watch's own
# clock (0.01 s: every run "hung"), never a rank.
MIN_HANG_TIMEOUT_S = 1.0
POLLS_PER_TIMEOUT = 10


def usable_hang_timeout(asked: float, poll_s: float, notes: list[str] | None = None) -> float:
    """`asked`, or the floor the watch can measure when it is shorter (said in `notes`)."""
    floor = max(MIN_HANG_TIMEOUT_S, POLLS_PER_TIMEOUT * poll_s)
    if asked >= floor:
        return asked
    if notes is not None:
        notes.append(
            f"--hang-timeout {asked:g} s is shorter than the engine can show progress in "
            f"(a step is read every {poll_s:g} s); raised to {floor:g} s"
        )
    return floor


@dataclass
class RankTail:
    path: Path
    last_change: float
    offset: int = 0
    last: dict[str, Any] | None = None
    first_seen: float | None = None  # when its first step line was read
    faults_fired: int = 0
    fault_counts: dict[str, int] = field(default_factory=dict)  # fault name -> times fired
    busy: Callable[[dict[str, Any]], bool] | None = None  # None: every line is progress
    last_busy: dict[str, Any] | None = None  # the last line that counted as progress
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
        if self.busy is None:
            self._progressed(now)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            if line.strip():
                rec = json.loads(line)
                self._count_faults(rec.get("faults_fired") or ())
                self.last = rec
                if self.busy is None or self.busy(rec):
                    self.last_busy = rec
                    if self.busy is not None:
                        self._progressed(now)

    def _progressed(self, now: float) -> None:
        self.last_change = now
        if self.first_seen is None:
            self.first_seen = now

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
    busy: Callable[[dict[str, Any]], bool] | None = None  # which step lines are progress
    startup_grace_s: float | None = None  # None: startup_grace(hang_timeout)
    activity: float = 0.0  # the latest progress outside the step files (engine-reported)

    def __post_init__(self) -> None:
        if self.startup_grace_s is None:
            self.startup_grace_s = startup_grace(self.hang_timeout)
        for r in range(self.world_size):
            self.tails[r] = RankTail(
                rank_jsonl(self.run_dir, r), last_change=self.started, busy=self.busy
            )

    def note_activity(self, t: float) -> None:
        self.activity = max(self.activity, t)

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
            return now - max(self.started, self.activity) > self.startup_grace_s
        last = max(t.last_change for t in self.tails.values() if t.first_seen is not None)
        return now - max(last, self.activity) > self.hang_timeout

    def startup_s(self) -> dict[str, float | None]:
        """Seconds from launch to each rank's first step line (None: it never stepped)."""
        return {
            str(r): None if t.first_seen is None else round(t.first_seen - self.started, 3)
            for r, t in self.tails.items()
        }

    def last_steps(self) -> dict[str, Any]:
        """Per rank: its last recorded step and that line's own time (the rank's clock)."""
        return {
            str(r): {"step": (t.last_busy or {}).get("step"), "t": (t.last_busy or {}).get("t")}
            for r, t in self.tails.items()
        }

    def last_progress(self, line_clock: bool = False) -> dict[str, float]:
        """Per rank: when it last progressed, as read (our clock), or with `line_clock` as its
        last progress line says (ranks with none left out)."""
        if line_clock:
            return {
                str(r): float(t.last_busy.get("t") or t.last_change)
                for r, t in self.tails.items()
                if t.last_busy is not None
            }
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
