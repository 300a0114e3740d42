"""A recorded rank's snapshots (rank{r}.dump-N.json, evidence/recording_dump.DumpSnapshot), taken
from inside the scheduler process: no ptrace, so a pod without CAP_SYS_PTRACE still gives its
stacks.

What fires one: SGLang's watchdog (boot.py), the consensus checker's mismatch
(consensus_block.py), an exception leaving the event loop (boot.py), triage's
`dump-request.json` and the operator's DUMP_SIGNAL. The last two are answered by the rank's
dumper thread, never by the scheduler thread, which may be the one that is stuck: the signal's
C-level handler writes to a wakeup pipe the dumper thread waits on, so a scheduler thread
blocked in a collective does not delay the dump.
"""

from __future__ import annotations

import functools
import os
import select
import signal
import sys
import threading
import time
from typing import Any

from hicache_diag.engines.sglang.plugin.sinks import bounded
from hicache_diag.engines.sglang.plugin.step_fields import cache_fields
from hicache_diag.evidence.recording_dump import DumpSnapshot, ThreadDump
from hicache_diag.evidence.recording_files import DUMP_REQUEST, DUMP_SIGNAL, read_dump_request
from hicache_diag.evidence.step import StepRecord

POLL_S = 0.25  # how often the dumper thread looks at dump-request.json
MAX_FRAMES = 60
ANSWERED_KEPT = 64


def thread_dumps() -> list[ThreadDump]:
    """Every Python thread's stack, outermost frame first, named from code objects only (no
    source reads: the other threads run on meanwhile)."""
    frames = sys._current_frames()
    main = threading.main_thread().ident
    out = []
    for thread in threading.enumerate():
        frame = frames.get(thread.ident) if thread.ident is not None else None
        if frame is None:
            continue
        names = []
        while frame is not None and len(names) < MAX_FRAMES:
            code = frame.f_code
            names.append(f"{code.co_filename}:{frame.f_lineno} in {code.co_name}")
            frame = frame.f_back
        out.append(
            ThreadDump(
                name=thread.name,
                ident=thread.ident,
                native_id=getattr(thread, "native_id", None),
                daemon=thread.daemon,
                main=thread.ident == main,
                frames=names[::-1],
            )
        )
    return out


def scheduler_queues(scheduler: Any) -> dict[str, Any]:
    """The scheduler's own queue depths, as SGLang names them (what `pop from empty list` is
    read against): a key SGLang lacks is left out."""
    out: dict[str, Any] = {}
    waiting = getattr(scheduler, "waiting_queue", None)
    if waiting is not None:
        out["waiting"] = len(waiting)
    running = getattr(getattr(scheduler, "running_batch", None), "reqs", None)
    if running is not None:
        out["running"] = len(running)
    for name in ("mbs", "running_mbs"):  # event_loop_pp's micro-batch slots
        slots = getattr(scheduler, name, None)
        if isinstance(slots, list):
            out[name] = [
                len(getattr(b, "reqs", None) or []) if b is not None else None for b in slots
            ]
    for name in ("cur_batch", "cur_batch_for_debug"):  # the batch in flight (0.5.2x: _for_debug)
        if hasattr(scheduler, name):
            batch = getattr(scheduler, name)
            out[name] = None if batch is None else len(getattr(batch, "reqs", None) or [])
    if isinstance(getattr(scheduler, "forward_ct", None), int):
        out["forward_ct"] = scheduler.forward_ct
    return out


class RankDumper:
    """One rank's dumps: `dump(reason, ...)` from any thread; `start()` runs the dumper thread
    that answers dump requests and the signal."""

    def __init__(self, recording: Any, recorder: Any, state: Any) -> None:
        self.recording, self.recorder, self.state = recording, recorder, state
        self.session = recording.session
        self.answered: list[str] = []
        self._signals = 0  # signals seen by the Python-level handler
        self._signal_bytes = 0  # ... and through the wakeup pipe
        self._signals_dumped = 0
        self._wakeup: int | None = None  # read end of the wakeup pipe
        self.thread = threading.Thread(target=self._run, name="hicache-diag-dumper", daemon=True)

    # -- a snapshot ---------------------------------------------------------------------------
    def dump(self, reason: str, request: str | None = None, detail: dict | None = None):
        """Written through the recording (its path), None when off or it failed."""
        return self.recording.dump(self.snapshot(reason, request, detail), reason)

    def snapshot(self, reason: str, request: str | None, detail: dict | None) -> dict[str, Any]:
        start, errors = time.perf_counter(), []
        rec, scheduler = self.recorder, getattr(self.state, "scheduler", None)
        fields: dict[str, Any] = {}
        queues: dict[str, Any] = {}
        if scheduler is None:
            errors.append("no scheduler step seen yet: queues and pools not read")
        else:
            try:
                fields = cache_fields(scheduler, follower=rec.pp_rank > 0)
            except Exception as exc:  # noqa: BLE001 - read under a running scheduler: say so
                errors.append(f"pools and HiCache queues: {type(exc).__name__}: {exc}")
            try:
                queues = scheduler_queues(scheduler)
            except Exception as exc:  # noqa: BLE001
                errors.append(f"scheduler queues: {type(exc).__name__}: {exc}")
        steps = [s for s in map(StepRecord.parse, list(rec.tail)) if s is not None]
        snap = DumpSnapshot(
            rank=rec.rank,
            pp=rec.pp_rank,
            tp=rec.tp_rank,
            pid=os.getpid(),
            reason=reason,
            request=request,
            at=time.time(),
            step=rec.step,
            last_step=steps[-1].step if steps else None,
            steps=steps,
            queues=fields.get("queues", {}),
            scheduler=queues,
            device_free=fields.get("device_free"),
            host_free=fields.get("host_free"),
            tree_digest=fields.get("tree_digest"),
            threads=thread_dumps(),
            detail=detail or {},
            errors=errors,
        )
        took = round((time.perf_counter() - start) * 1000.0, 3)
        return {**snap.to_json(), "took_ms": took}

    # -- the dumper thread --------------------------------------------------------------------
    def start(self) -> None:
        self.thread.start()

    def install_signal(self) -> str | None:
        """DUMP_SIGNAL asks for a dump (main thread only, where Python allows it). Left alone
        when the process already handles it; the signal's name, or None when not installed."""
        signum = getattr(signal, DUMP_SIGNAL, None)
        if signum is None or threading.current_thread() is not threading.main_thread():
            return None
        if signal.getsignal(signum) not in (signal.SIG_DFL, None):
            return None
        signal.signal(signum, self._on_signal)
        read_end, write_end = os.pipe()
        os.set_blocking(read_end, False)
        os.set_blocking(write_end, False)
        old = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        if old != -1:  # someone else's wakeup fd: theirs stays, the handler alone wakes us
            signal.set_wakeup_fd(old)
            os.close(read_end)
            os.close(write_end)
        else:
            self._wakeup = read_end
        return DUMP_SIGNAL

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._signals += 1  # runs in the main thread, whenever it next runs Python

    def _wait(self) -> None:
        """POLL_S, or less when a signal arrives through the wakeup pipe."""
        if self._wakeup is None:
            time.sleep(POLL_S)
            return
        ready, _, _ = select.select([self._wakeup], [], [], POLL_S)
        if ready:
            try:
                data = os.read(self._wakeup, 512)
            except BlockingIOError:
                return
            self._signal_bytes += data.count(bytes([getattr(signal, DUMP_SIGNAL)]))

    def _run(self) -> None:
        seen_mtime = None
        while self.recording.on:
            self._wait()
            # One dump per signal: the pipe and the Python handler each see every signal.
            signals = max(self._signals, self._signal_bytes)
            if signals > self._signals_dumped:
                self._signals_dumped = signals
                self.dump("signal")
            try:
                mtime = os.stat(self.session / DUMP_REQUEST).st_mtime_ns
            except OSError:
                continue
            if mtime != seen_mtime:
                seen_mtime = mtime
                self._answer(read_dump_request(self.session))

    def _answer(self, request: dict[str, Any] | None) -> None:
        if request is None or request["id"] in self.answered:
            return
        self.answered = [*self.answered[-(ANSWERED_KEPT - 1) :], request["id"]]
        self.dump("asked", request=request["id"])


# The rank's dumper, once armed (production only): what the watchdog, the checker and the
# event loop wrappers fire through.
RANK: list[RankDumper] = []


def fire(reason: str, detail: dict[str, Any] | None = None) -> None:
    """A dump now, if this process is a recorded rank; never raises. The snapshot is taken in
    the calling thread (SGLang's watchdog, checker or scheduler thread: the moment it fired);
    the write is waited for WAIT_S at most, so a stuck disk never holds SGLang's own path."""
    for dumper in RANK:
        try:
            doc = dumper.snapshot(reason, None, detail)
        except Exception as exc:  # noqa: BLE001 - SGLang's own path goes on regardless
            dumper.recording.turn_off(f"{reason} dump: {type(exc).__name__}: {exc}")
            continue
        bounded(functools.partial(dumper.recording.dump, doc, reason))
