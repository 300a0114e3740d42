"""Where the recorder's step lines go: a run's rank{r}.jsonl (RunSink, what `run --engine sglang`
has always written), or a production recording (RecordingSink: evidence/recording.py's files,
written by a thread of its own so that the scheduler thread never waits on the disk).

The recording sink is bounded and never in the way: lines wait in memory at most MAX_PENDING
deep and SLOW_S long; past either, or on any error of the writer, the recording turns off for
the rank (`on_off` hears why, once) and the scheduler goes on as if it had never been there.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

MAX_PENDING = 1024  # lines queued for the writer thread (a slow or stuck disk)
SLOW_S = 10.0  # a write the writer thread has been in for longer: the disk is stuck
WRITE_EVERY_S = 0.05  # the writer thread's poll
BATCH = 64  # lines written at once (one write a file)
WAIT_S = 2.0  # what another thread (a crash, the exit) waits for a flush at most


def bounded(fn: Callable[[], Any], wait_s: float | None = None) -> None:
    """`fn()` in a thread of its own, waited for `wait_s` at most: a stuck disk must never
    hold up SGLang's own thread (its crash report, its watchdog, its exit)."""
    thread = threading.Thread(target=fn, name="hicache-diag-flush", daemon=True)
    thread.start()
    thread.join(WAIT_S if wait_s is None else wait_s)


class RunSink:
    """rank{r}.jsonl of a run directory, line-buffered (one flush a line), as it always was."""

    production = False

    def __init__(self, path: str) -> None:
        self._fh = open(path, "a", buffering=1)

    def write(self, line: dict[str, Any], text: str) -> None:
        self._fh.write(text + "\n")

    def flush(self) -> None:
        pass  # line-buffered: every line is in the file once written

    def switch(self, path: str) -> None:
        """A warm server's next trial (clean_state.py): lines go to `path` from now on."""
        self._fh, old = open(path, "a", buffering=1), self._fh
        old.close()

    def close(self) -> None:
        try:
            self._fh.close()
        except OSError:
            pass


class RecordingSink:
    """A rank's production recording (`recording.RankRecording`). `write` only queues: the
    writer thread writes every WRITE_EVERY_S. `fail(reason)` turns the rank's recording off
    from any thread without waiting on the disk (a thread stuck in a write holds its lock)."""

    production = True

    def __init__(self, recording: Any, fields: tuple[str, ...], on_off: Callable[[str], None]):
        self.recording, self._fields, self._on_off = recording, fields, on_off
        self._pending: deque[tuple[dict[str, Any], str]] = deque()
        self._writing_since: float | None = None
        self._flush_lock = threading.Lock()
        self._closed = False
        self.off_reason: str | None = None if recording.on else recording.meta.off_reason
        self._thread = threading.Thread(target=self._run, name="hicache-diag-writer", daemon=True)
        if self.off_reason is None:
            self._thread.start()

    @property
    def on(self) -> bool:
        return self.off_reason is None

    def write(self, line: dict[str, Any], text: str) -> None:
        if self.off_reason is not None:
            return
        since = self._writing_since
        if since is not None and time.monotonic() - since > SLOW_S:
            self.fail(f"disk too slow: one write has taken over {SLOW_S:.0f} s")
            return
        if len(self._pending) >= MAX_PENDING:
            self.fail(f"disk too slow: {MAX_PENDING} step lines waiting to be written")
            return
        # What the digests need (the step and its must-agree fields) rides with the text;
        # the values are the line's own objects, nothing is copied.
        held = {k: line[k] for k in self._fields if k in line}
        held["step"] = line.get("step", 0)
        self._pending.append((held, text))

    def flush(self) -> None:
        """Everything queued, written now (a crash line before the process exits), waited
        for WAIT_S at most."""
        bounded(self._drain)

    def _drain(self) -> None:
        with self._flush_lock:
            while self._pending and self.off_reason is None:
                batch = [self._pending.popleft() for _ in range(min(BATCH, len(self._pending)))]
                self._writing_since = time.monotonic()
                self.recording.write_steps(batch)
                self._writing_since = None
                if not self.recording.on:
                    self.fail(self.recording.meta.off_reason or "recording off")

    def _run(self) -> None:
        while self.off_reason is None and not self._closed:
            time.sleep(WRITE_EVERY_S)
            try:
                self._drain()
            except Exception as exc:  # noqa: BLE001 - the writer's own failure: off, said once
                self.fail(f"writer: {type(exc).__name__}: {exc}")

    def fail(self, reason: str) -> None:
        if self.off_reason is not None:
            return
        self.off_reason = reason
        self._pending.clear()
        self._on_off(reason)
        # The meta says so too, from a thread of its own: a stuck disk must not hold us here.
        threading.Thread(
            target=self.recording.turn_off, args=(reason,), name="hicache-diag-off", daemon=True
        ).start()

    def close(self) -> None:
        self._closed = True  # the writer thread ends; what it left is written here

        def drain_and_close() -> None:
            try:
                self._drain()
            finally:
                self.recording.close()

        bounded(drain_and_close)
