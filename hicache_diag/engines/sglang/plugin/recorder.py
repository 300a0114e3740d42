"""rank{r}.jsonl from inside a real SGLang scheduler: one line per step (docs/evidence.md).

A step is one call of `Scheduler.get_next_batch_to_run`, i.e. one micro-batch slot of
`event_loop_pp`. Every PP stage makes those calls in lockstep (each slot receives the previous
stage's request list), so step N means the same slot on every rank. Idle slots (no batch, no
ack, nothing queued) are not written one by one: PP0 polls thousands of them a second. They are
counted into the next line (`idle_polls`), and a heartbeat line is written at most once a second
so that the hang watch still sees a live, idle rank. Keys SGLang does not have are left out.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from typing import Any

from hicache_diag import evidence as ev
from hicache_diag.evidence.probes import MAX_VALUES

HEARTBEAT_S = 1.0
MAX_SHORTAGES = 4  # per step line: the first ones carry the evidence, the count all of them
# What every rank must hold identically at the same step (only keys actually recorded): the one
# list (evidence.py, importable here: it imports nothing of ours) and what SGLang aligns besides.
MUST_AGREE = ev.MUST_AGREE + ev.MUST_AGREE_SGLANG
STORAGE_QUEUES = (  # SGLang's names; the clean-state proof reads them too
    "prefetch_queue",
    "prefetch_buffer",
    "prefetch_hit_queue",
    "prefetch_sync_queue",
    "ack_prefetch_queue",
    "backup_queue",
    "ack_backup_queue",
    "host_mem_release_queue",
)


def _len(obj: Any) -> int | None:
    if obj is None:
        return None
    if hasattr(obj, "qsize"):
        return int(obj.qsize())
    try:
        return len(obj)
    except TypeError:
        return None


def _size(obj: Any) -> int:
    """Length of a list or tensor alike (releases differ); never by truthiness, which a tensor
    of no elements cannot answer."""
    if obj is None:
        return 0
    if hasattr(obj, "numel"):
        return int(obj.numel())
    return len(obj)


def _as_int(value: Any) -> int:
    """An int from an int, a one-element tensor or None (0)."""
    if value is None:
        return 0
    if hasattr(value, "item"):
        return int(value.item())
    return int(value)


def _ready(queue: list) -> int:
    n = 0
    for ack in queue:
        if not ack.finish_event.query():
            break
        n += 1
    return n


class StepRecorder:
    """Owned by the scheduler thread; DMA-side counters (`count`) may come from other threads
    but are plain int additions under the GIL."""

    def __init__(self, path: str, rank: int, pp_rank: int, tp_rank: int, hooks: Any) -> None:
        self.rank, self.pp_rank, self.tp_rank, self.hooks = rank, pp_rank, tp_rank, hooks
        self._fh = open(path, "a", buffering=1)  # line-buffered: one flush per line
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
        line.update(_batch_fields(batch))
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
        self._fh.write(ev.StepRecord.from_json(line).line() + "\n")

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

    def switch(self, path: str) -> None:
        """A warm server's next trial (clean_state.py): its lines go to `path` from the next
        step on (the old file kept if it cannot be opened); the step count runs on."""
        self._fh, old = open(path, "a", buffering=1), self._fh
        old.close()
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
            self._fh.close()
        except OSError:
            pass


def _any_queued(queues: dict[str, Any]) -> bool:
    return any(v for v in queues.values() if isinstance(v, int))


def _batch_fields(batch: Any) -> dict[str, Any]:
    if batch is None:
        return {"rids": []}
    reqs = list(getattr(batch, "reqs", []) or [])
    out: dict[str, Any] = {"rids": [r.rid for r in reqs]}
    mode = getattr(batch, "forward_mode", None)
    is_extend = bool(mode is not None and hasattr(mode, "is_extend") and mode.is_extend())
    out["forward_mode"] = getattr(mode, "name", str(mode))
    if is_extend:
        out["extend_num_tokens"] = _as_int(getattr(batch, "extend_num_tokens", None))
        out["prefix_len"] = {r.rid: _prefix_len(r) for r in reqs}
        out["host_hit_len"] = {r.rid: _as_int(getattr(r, "host_hit_length", None)) for r in reqs}
        if any(hasattr(r, "host_loaded_length") for r in reqs):  # 0.5.2x: what was loaded back
            out["host_loaded_len"] = {
                r.rid: _as_int(getattr(r, "host_loaded_length", None)) for r in reqs
            }
        if any(hasattr(r, "storage_hit_length") for r in reqs):
            out["l3_hit_len"] = {
                r.rid: _as_int(getattr(r, "storage_hit_length", None)) for r in reqs
            }
    return out


def _prefix_len(req: Any) -> int:
    """Device-hit tokens of a request: `prefix_len` in 0.5.2x, `len(prefix_indices)` before."""
    if hasattr(req, "prefix_len"):
        return _as_int(req.prefix_len)
    return _size(getattr(req, "prefix_indices", None))


def cache_fields(scheduler: Any, follower: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {}
    allocator = getattr(scheduler, "token_to_kv_pool_allocator", None)
    if allocator is not None:
        out["device_free"] = int(allocator.available_size())
    tree = getattr(scheduler, "tree_cache", None)
    cc = getattr(tree, "cache_controller", None)
    if cc is None:
        return out
    host = getattr(cc, "mem_pool_host", None)
    if host is not None:
        out["host_free"] = int(host.available_size())
    queues = {
        name: _len(getattr(cc, name, None))
        for name in ("write_queue", "load_queue", "ack_write_queue", "ack_load_queue")
    }
    for name in STORAGE_QUEUES:
        if getattr(cc, name, None) is not None:
            queues[name] = _len(getattr(cc, name))
    out["queues"] = {k: v for k, v in queues.items() if v is not None}
    # The recorder's own poll, after the drain. Where SGLang relays PP0's count (0.5.2x's
    # `_sync_hicache_ready_counts`) a follower never polls: no poll is presented as its own
    # there (`acks_counted` is what PP0 counted; docs/evidence.md).
    if not (follower and hasattr(tree, "_sync_hicache_ready_counts")):
        out["acks_ready"] = {"write": _ready(cc.ack_write_queue), "load": _ready(cc.ack_load_queue)}
    out["tree_digest"] = _tree_digest(tree)
    return out


def _tree_digest(tree: Any) -> str | None:
    """A digest of the tree's accounting (evictable / protected / total sizes): equal trees give
    equal digests; it is cheap enough to take every step, unlike a walk of every node."""
    parts = []
    for name in ("evictable_size", "protected_size", "total_size"):
        fn = getattr(tree, name, None)
        if callable(fn):
            try:
                parts.append(repr(fn()))
            except Exception:  # noqa: BLE001 - a digest must never break a step
                return None
    return hashlib.sha1("|".join(parts).encode()).hexdigest()[:12] if parts else None


def jsonl_path(run_dir: str, rank: int) -> str:
    return str(ev.rank_jsonl(run_dir, rank))
