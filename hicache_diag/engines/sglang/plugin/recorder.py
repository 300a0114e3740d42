"""rank{r}.jsonl from inside a real SGLang scheduler: one line per step (docs/evidence.md).

A step is one call of `Scheduler.get_next_batch_to_run`, i.e. one micro-batch slot of
`event_loop_pp`. Every PP stage makes those calls in lockstep (each slot receives the previous
stage's request list), so step N means the same slot on every rank. Idle slots (no batch, no
ack, nothing queued) are not written one by one: PP0 polls thousands of them a second. They are
counted into the next line (`idle_polls`), and a heartbeat line is written at most once a second
so that the hang watch still sees a live, idle rank. Keys SGLang does not have are left out.
"""

from __future__ import annotations

import os
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

from hicache_diag import evidence as ev
from hicache_diag.engines.sglang.plugin.sinks import RunSink
from hicache_diag.engines.sglang.plugin.step_fields import batch_fields, cache_fields
from hicache_diag.evidence.probes import MAX_VALUES

HEARTBEAT_S = 1.0
MAX_SHORTAGES = 4  # per step line: the first ones carry the evidence, the count all of them
# What every rank must hold identically at the same step (only keys actually recorded): the one
# list (evidence.py, importable here: it imports nothing of ours) and what SGLang aligns besides.
MUST_AGREE = ev.MUST_AGREE + ev.MUST_AGREE_SGLANG
TAIL_LINES = 32  # the last step lines held in memory, for a dump


class StepRecorder:
    """Owned by the scheduler thread; DMA-side counters (`count`) may come from other threads
    but are plain int additions under the GIL. `sink`: a run's rank{r}.jsonl path (RunSink) or
    a production recording's sink (sinks.py). `on_failure`, when set (production), hears a
    failure of the recorder itself, which then stops recording the rank; without it (a run) a
    failed step is written as a `recorder_error` line."""

    def __init__(self, sink: Any, rank: int, pp_rank: int, tp_rank: int, hooks: Any) -> None:
        self.rank, self.pp_rank, self.tp_rank, self.hooks = rank, pp_rank, tp_rank, hooks
        self.sink = RunSink(sink) if isinstance(sink, str | os.PathLike) else sink
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)  # rendered lines, oldest first
        self.on_failure: Callable[[str], None] | None = None
        self.step = 0
        self._counts: Counter[str] = Counter()
        self._consumed: Counter[str] = Counter()
        self._sync: dict[str, Any] = {}
        self._waits: dict[str, float] = {}
        self._counted: dict[str, int] = {}
        self._acked: list[Any] = []  # node ids whose write-through this rank finished
        self._shortages: list[dict[str, int]] = []
        self.host_held = 0  # tokens the side pool holds (host-shortage), set by the step wrapper
        self._idle = 0
        self._last_write = 0.0
        self.pp_loop_size: int | None = None
        self._errors = 0  # steps whose line could not be built since the last error line
        self._last_error_write = 0.0
        self._crash_written = False
        self._open = False  # inside get_next_batch_to_run: the step has no line yet
        # Reads of inventoried sources since the previous step ended (probe_table.py): a
        # read in process_input_requests, before get_next_batch_to_run, belongs to that step.
        self._reads: dict[str, dict[str, Any]] = {}
        self._acted = False  # a probed decision acted: the step gets its own line
        self._armed_written = False

    # -- fed by the wrappers --------------------------------------------------------------
    def count(self, key: str, n: int) -> None:
        self._counts[key] += int(n)

    def peek(self, key: str) -> int:
        return self._counts[key]

    def waited(self, key: str, seconds: float) -> None:
        """Time the forward spent waiting (float ms, summed over the step)."""
        self._waits[key] = self._waits.get(key, 0.0) + seconds * 1000.0

    def shortage(self, *, need: int, free: int, evicted: int, evict_calls: int) -> None:
        """A backup this rank's host pool could not take after evict_host: SGLang's own
        shortage branch (`_execute_kv_backup` returned None), with what it read."""
        self._counts["host_shortage"] += 1
        if len(self._shortages) < MAX_SHORTAGES:
            self._shortages.append(
                {
                    "need": int(need),
                    "free": int(free),
                    "evicted": int(evicted),
                    "evict_calls": int(evict_calls),
                }
            )

    def acked_node(self, node_id: Any) -> None:
        self._acked.append(node_id if isinstance(node_id, int) else str(node_id))

    def counted(self, kind: str, n: int) -> None:
        """SGLang's own pre-drain count of ready acks (`_count_ready_acks`), on the rank that
        counted: PP0 alone in 0.5.2x, whose count `_pp_sync` relays to the followers."""
        self._counted[kind] = self._counted.get(kind, 0) + int(n)

    def consumed(self, kind: str, n: int) -> None:
        self._consumed[kind] += int(n)

    def synced(self, name: str, value: Any) -> None:
        self._sync[name] = value

    def source_read(self, name: str, value: Any) -> None:
        """A read of an inventoried source (probe_table.py): its value on this rank."""
        rec = self._reads.get(name)
        if rec is None:
            rec = self._reads[name] = {"n": 0, "v": []}
        rec["n"] += 1
        if len(rec["v"]) < MAX_VALUES:
            rec["v"].append(value)

    def source_decided(self, name: str, outcome: Any) -> None:
        """What the decision fed by `name` did in this step; a step where one acted is written
        (not folded into `idle_polls`), so that ranks can be compared at that step."""
        rec = self._reads.get(name)
        if rec is None:
            rec = self._reads[name] = {"n": 0, "v": []}
        rec.setdefault("d", []).append(outcome)
        self._acted = True

    # -- one step ---------------------------------------------------------------------------
    def begin_step(self) -> int:
        self.hooks.step = self.step
        self._open = True
        return self.step

    def end_step(self, scheduler: Any, batch: Any) -> None:
        try:
            self._end_step(scheduler, batch)
        except Exception as exc:  # noqa: BLE001 - recording must never break SGLang's step
            if self.on_failure is not None:  # production: the rank stops recording, said once
                self.on_failure(f"step {self.step}: {type(exc).__name__}: {exc}")
                return
            # Counted, never swallowed: the verdict names a blind recorder (docs/evidence.md).
            # One line per heartbeat at most, so a failing idle poll cannot flood the file.
            self._errors += 1
            now = time.monotonic()
            if not self._last_error_write or now - self._last_error_write >= HEARTBEAT_S:
                self._write(
                    {
                        "step": self.step,
                        "rank": self.rank,
                        "t": time.time(),
                        "recorder_error": f"{type(exc).__name__}: {exc}",
                        "recorder_errors": self._errors,
                    }
                )
                self._errors, self._last_error_write = 0, now
        self._reads, self._acted = {}, False  # written, or an idle poll's: decided nothing
        self.step += 1
        self._open = False

    def _end_step(self, scheduler: Any, batch: Any) -> None:
        line = self._line(scheduler, batch)
        busy = batch is not None or any(self._counts.values()) or any(self._consumed.values())
        busy = busy or bool(line.get("faults_fired")) or _any_queued(line.get("queues", {}))
        busy = busy or bool(self._waits) or bool(self._acked) or self._acted
        now = time.monotonic()
        if busy or now - self._last_write >= HEARTBEAT_S:
            line["idle_polls"] = self._idle
            if not busy:
                line["idle"] = True
                line["must_agree"] = []
            if not self._armed_written:  # once per rank: the probes this release has
                from hicache_diag.engines.sglang.plugin.source_probes import ARMED

                line["sources_armed"] = sorted(ARMED)
                self._armed_written = True
            self._write(line)
            self._idle, self._last_write = 0, now
            self._counts.clear()
            self._consumed.clear()
            self._sync = {}
            self._waits = {}
            self._counted = {}
            self._acked = []
            self._shortages = []
        else:
            self._idle += 1

    def _line(self, scheduler: Any, batch: Any) -> dict[str, Any]:
        line: dict[str, Any] = {
            "step": self.step,
            "t": time.time(),
            "rank": self.rank,
            "pp": self.pp_rank,
            "tp": self.tp_rank,
        }
        if self.pp_loop_size:
            line["slot"] = self.step % self.pp_loop_size
        line.update(batch_fields(batch))
        line.update(cache_fields(scheduler, follower=self.pp_rank > 0))
        line["acks_consumed"] = {"write": self._consumed["write"], "load": self._consumed["load"]}
        line["write_backs"] = self._counts["write_backs"]
        line["load_backs"] = self._counts["load_backs"]
        line["evicted"] = self._counts["evicted"]
        # Allocs the host pool answered with nothing (short, or a fault), whoever asked.
        line["host_alloc_failed"] = self._counts["host_alloc_failed"]
        # SGLang's own host shortage path: slots evict_host freed, and backups it still skipped.
        line["host_evicted"] = self._counts["host_evicted"]
        line["host_evict_calls"] = self._counts["host_evict_calls"]
        line["host_shortage"] = self._counts["host_shortage"]
        if self._shortages:
            line["host_shortages"] = list(self._shortages)
        # device-alloc-fail's load-backs; source probes that failed (source_probes.py); what
        # this rank's own clocks released: its reap tick (hook_points.py), its waiting timeout
        keys = ("device_held", "load_back_declined", "probe_errors")
        for key in (*keys, "sessions_closed", "waiting_timeouts"):
            if self._counts[key]:
                line[key] = self._counts[key]
        if self.host_held:
            line["host_held"] = self.host_held
        for key, ms in self._waits.items():
            line[key] = round(ms, 3)
        if self._sync:
            line["sync_received"] = dict(self._sync)
        if self._counted:
            line["acks_counted"] = dict(self._counted)
        if self._acked:
            line["write_acked_nodes"] = list(self._acked)
        if self._reads:
            line["sources"] = self._reads
        line["faults_fired"] = self.hooks.drain_fired()
        line["must_agree"] = [k for k in MUST_AGREE if k in line]
        return line

    def _write(self, line: dict[str, Any]) -> None:
        """The one step-line writer (evidence.StepRecord), shared with our runtime's recorder."""
        text = ev.StepRecord.from_json(line).line()
        self.sink.write(line, text)
        self.tail.append(text)

    def write_crash(self, exc: BaseException) -> None:
        """The step a scheduler died in, so the verdict sees how far each rank got, with what
        the rank counted in it before it raised (a host alloc that failed in the same step).
        Written once, whichever wrapper the exception leaves first. Raised after the step's
        line (in its forward or result processing), it carries that step's number again."""
        if self._crash_written:
            return
        self._crash_written = True
        step = self.step if self._open or self.step == 0 else self.step - 1
        line: dict[str, Any] = {
            "step": step,
            "t": time.time(),
            "rank": self.rank,
            "pp": self.pp_rank,
            "tp": self.tp_rank,
            "crashed": True,
            "error": f"{type(exc).__name__}: {exc}",
        }
        line.update({k: v for k, v in self._counts.items() if v})
        if self._shortages:  # the backups skipped in the step it died in: the evidence
            line["host_shortages"] = list(self._shortages)
        if self.host_held:
            line["host_held"] = self.host_held
        line.update({k: round(ms, 3) for k, ms in self._waits.items()})
        line["faults_fired"] = self.hooks.drain_fired()
        self._write(line)
        self.sink.flush()  # the process may be gone in a moment

    def switch(self, path: str) -> None:
        """A warm server's next trial (clean_state.py): its lines go to `path` from the next
        step on (the old file kept if it cannot be opened); the step count runs on."""
        self.sink.switch(path)
        self._armed_written = self._crash_written = False
        self._idle, self._last_write = 0, 0.0

    def close(self) -> None:
        try:
            if self._errors:  # failed steps since the last error line: counted, not lost
                self._write(
                    {
                        "step": self.step,
                        "rank": self.rank,
                        "t": time.time(),
                        "recorder_error": "(as above)",
                        "recorder_errors": self._errors,
                    }
                )
        except OSError:
            pass
        self.sink.close()


def _any_queued(queues: dict[str, Any]) -> bool:
    return any(v for v in queues.values() if isinstance(v, int))


def jsonl_path(run_dir: str, rank: int) -> str:
    return str(ev.rank_jsonl(run_dir, rank))
