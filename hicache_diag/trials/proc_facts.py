"""Process facts (ours): how a rank is doing as the kernel sees it, for the verdict's evidence.

The jsonl says what a rank did; the kernel says what it is: stopped (`T`, SIGSTOP), sleeping,
running, or dead by a signal or the OOM killer. A rank that died or stopped is named by these
facts, never by a guess from the faults that were injected.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import psutil

# psutil's names for `T` (SIGSTOP/SIGTSTP) and `t` (stopped by a tracer).
STOPPED = frozenset({psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP})


def status_of(pid: int) -> str:
    """psutil's status name ('running', 'sleeping', 'stopped', ...) or 'gone'."""
    try:
        return psutil.Process(pid).status()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return "gone"
    except psutil.Error:
        return "unknown"


def _oom_counter_files() -> list[Path]:
    """Files whose `oom_kill N` line counts OOM kills in our memory cgroup: cgroup v2's
    memory.events, or v1's memory.oom_control (inside a container the cgroup is mounted at
    its root, so the root file is a candidate too)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    root, found = Path("/sys/fs/cgroup"), []
    for line in lines:
        _, controllers, rel = line.split(":", 2)
        rel = rel.lstrip("/")
        if controllers == "":
            found += [root / rel / "memory.events"]
        elif "memory" in controllers.split(","):
            found += [root / "memory" / rel / "memory.oom_control"]
            found += [root / "memory" / "memory.oom_control"]
    return [p for p in found if p.is_file()]


def oom_kill_count() -> int | None:
    """How many processes the OOM killer has killed in our cgroup so far (None: unknown)."""
    for path in _oom_counter_files():
        try:
            for line in path.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            continue
    return None


@dataclass
class StopWatch:
    """Polls each live rank's kernel state; remembers since when a rank has been stopped."""

    stopped_since: dict[int, float] = field(default_factory=dict)  # rank -> first seen stopped
    last_status: dict[int, str] = field(default_factory=dict)

    def poll(self, states: dict[int, str], now: float) -> None:
        """`states`: rank -> psutil's status name of every live rank (the engine's
        `kernel_states`: `status_of` its pid here, or its node's own facts)."""
        for rank, status in states.items():
            self.last_status[rank] = status
            if status in STOPPED:
                self.stopped_since.setdefault(rank, now)
            else:
                self.stopped_since.pop(rank, None)

    def stopped_for(self, now: float) -> dict[int, float]:
        """rank -> seconds it has been stopped, for the ranks stopped now."""
        return {r: now - t for r, t in self.stopped_since.items()}
