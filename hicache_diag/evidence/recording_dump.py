"""rank{r}.dump-N.json's records: what one rank of a recorded server held when it was asked, or
when something fired (evidence/recording_files.DUMP_REASONS), taken from inside the process
(faulthandler-style: `sys._current_frames`, no ptrace). Standard library only."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hicache_diag.evidence.record import Record
from hicache_diag.evidence.step import StepRecord


@dataclass(frozen=True, slots=True)
class ThreadDump(Record):
    """One Python thread of the rank's process, as `sys._current_frames` had it."""

    name: str = ""
    ident: int | None = None
    native_id: int | None = None  # the kernel's tid: /proc/PID/task/TID, py-spy's thread id
    daemon: bool | None = None
    main: bool = False  # the process's main thread: the scheduler's own
    frames: list[str] = field(default_factory=list)  # "file:line in func", outermost first


@dataclass(frozen=True, slots=True)
class DumpSnapshot(Record):
    """One rank's state at a dump. `steps`: the recorder's last step lines (held in memory, so
    a dump never reads the disk back); `queues`: the HiCache controller's queue lengths, as a
    step line has them; `scheduler`: the scheduler's own queue depths (`waiting`, `running`,
    ...); `detail`: what fired (the watchdog's name and timeout, the exception, the mismatch's
    first-divergence block); `errors`: what could not be read (never a guessed value)."""

    nested = {"steps": StepRecord, "threads": ThreadDump}

    rank: int = 0
    pp: int = 0
    tp: int = 0
    pid: int | None = None
    reason: str = ""
    request: str | None = None  # the dump-request id this dump answers
    at: float | None = None
    step: int | None = None  # the recorder's step counter at the dump
    last_step: int | None = None  # the last step line the recorder wrote
    steps: list[StepRecord] = field(default_factory=list)
    queues: dict[str, int] = field(default_factory=dict)
    scheduler: dict[str, Any] = field(default_factory=dict)
    device_free: int | None = None
    host_free: int | None = None
    tree_digest: str | None = None
    threads: list[ThreadDump] = field(default_factory=list)
    detail: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    took_ms: float | None = None

    @property
    def main_thread(self) -> ThreadDump | None:
        return next((t for t in self.threads if t.main), None)
