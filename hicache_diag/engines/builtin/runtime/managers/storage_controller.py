"""The storage half of SGLang's HiCacheController (sglang/srt/managers/cache_controller.py):
the L2<->L3 queues, the thread lifecycle and the scheduler-side calls; ours as a class, with
SGLang's names for the queues and methods. The thread bodies live in `storage_threads.py`.

The scheduler thread submits operations, allocates host memory for agreed hits, consumes the
control queues by agreed counts (blocking until its own threads produced them) and decides
termination; the threads never touch the radix tree.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from queue import Empty, Queue
from typing import Any, Protocol

import torch

from hicache_diag.engines.builtin.runtime.distributed.comm import HiCacheComm
from hicache_diag.engines.builtin.runtime.managers.storage_operation import (
    PrefetchAck,
    PrefetchOperation,
    PrefetchTimeoutConfig,
    StorageOperation,
)
from hicache_diag.engines.builtin.runtime.managers.storage_pages import HostPages
from hicache_diag.engines.builtin.runtime.managers.storage_threads import StorageThreadsMixin
from hicache_diag.engines.builtin.runtime.mem_cache.hicache_storage import (
    STORAGE_BATCH_SIZE,
    HiCacheStorage,
    StorageFault,
)
from hicache_diag.engines.builtin.runtime.protocol import ProtocolConfig

logger = logging.getLogger(__name__)

INPUT_QUEUES = ("prefetch_queue", "prefetch_buffer", "prefetch_sync_queue", "backup_queue")
CONTROL_QUEUES = (
    "prefetch_hit_queue",
    "ack_prefetch_queue",
    "ack_backup_queue",
    "host_mem_release_queue",
)
STORAGE_QUEUES = INPUT_QUEUES + CONTROL_QUEUES
DEFAULT_TIMEOUT = PrefetchTimeoutConfig()


def _empty_step() -> dict[str, dict[str, Any]]:
    keys = ("l3_hit_len", "l3_hit_len_local", "l3_progress", "l3_progress_local", "storage_counts")
    return {k: {} for k in keys}


class HostPool(Protocol):
    def alloc(self, need_size: int) -> torch.Tensor | None: ...
    def free(self, indices: torch.Tensor) -> Any: ...


class StorageController(StorageThreadsMixin):
    """L3 queues and threads of one rank. `start()` / `stop()` bracket the threads; every
    public method without a `_thread_func` suffix is for the scheduler thread only."""

    def __init__(
        self,
        storage: HiCacheStorage,
        host_pool: HostPool,
        page_size: int,
        comm: HiCacheComm,
        protocol: ProtocolConfig,
        prefetch_policy: str,  # ServerArgs.hicache_storage_prefetch_policy (run_options' default)
        timeout: PrefetchTimeoutConfig = DEFAULT_TIMEOUT,
        clock: Callable[[], float] = time.monotonic,
        storage_batch_size: int = STORAGE_BATCH_SIZE,
    ) -> None:
        self.storage, self.host_pool, self.comm = storage, host_pool, comm
        self.page_size = page_size
        self.host_pages = HostPages(host_pool, page_size)
        self.l3_hit_min = protocol.mode("l3-hit") == "min"
        self.l3_progress_min = protocol.mode("l3-progress") == "min"
        self.prefetch_policy, self.timeout, self.clock = prefetch_policy, timeout, clock
        self.storage_batch_size = storage_batch_size
        for name in STORAGE_QUEUES:
            setattr(self, name, Queue())
        self.storage_stop_event = threading.Event()
        self._threads: list[threading.Thread] = []
        self._faults: list[StorageFault] = []
        self._faults_lock = threading.Lock()
        self.stats = {"hit_pages_local": 0, "hit_pages": 0, "read_pages": 0, "backup_pages": 0}
        # the last value each thread used after its (optional) MIN; evidence `sync_received`
        self.sync_received: dict[str, int | None] = {"l3_hit": None, "l3_progress": None}
        self._step = _empty_step()  # scheduler thread only
        self.prefetch_tokens_occupied = 0
        self.prefetch_capacity_limit = int(getattr(host_pool, "size", 0) * 0.5)

    # ---- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        if self._threads:
            raise RuntimeError("storage threads already started")
        targets = (
            ("prefetch", self.prefetch_thread_func),
            ("prefetch-io", self.prefetch_io_aux_func),
            ("prefetch-sync", self.prefetch_sync_thread_func),
            ("backup", self.backup_thread_func),
        )
        for name, target in targets:
            thread = threading.Thread(target=target, name=f"hicache-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float = 5.0) -> list[str]:
        """Stop and join every thread; returns the names of threads still alive (a thread
        stuck in a collective whose peer is gone). Idempotent."""
        self.storage_stop_event.set()
        for name in INPUT_QUEUES:
            getattr(self, name).put(None)  # wake a blocked get() at once
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive()]
        if alive:
            logger.error("HiCache storage threads did not stop: %s", alive)
        return alive

    # ---- scheduler-side API ---------------------------------------------------------------

    def prefetch(
        self, request_id: str, new_input_tokens: list[int], last_hash: str | None = None
    ) -> PrefetchOperation:
        operation = PrefetchOperation(request_id, new_input_tokens, self.clock(), last_hash)
        operation.step = self.storage.hooks.step
        self.prefetch_queue.put(operation)
        return operation

    def prefetch_rate_limited(self) -> bool:
        """SGLang's cap: stop prefetching while reserved tokens reach half the host pool.
        The tree adds to / subtracts from `prefetch_tokens_occupied`; a leak stops L3 for the
        life of the process with only a rate-limited warning in SGLang, so probes report it."""
        return self.prefetch_tokens_occupied >= self.prefetch_capacity_limit

    def submit_prefetch_io(
        self, operation: PrefetchOperation, host_indices: torch.Tensor | None = None
    ) -> bool:
        """Hand the reads of the agreed hit to the IO thread, into `host_indices` (slots agreed
        by a vote) or into slots allocated here (host-alloc=local); False (nothing queued, no
        acks will come) when the host pool is short."""
        if host_indices is None:
            host_indices = self.host_pool.alloc(operation.storage_hit_count)
        if host_indices is None:
            return False
        operation.host_indices = host_indices
        operation.step = self.storage.hooks.step  # the reads' issuing step (lookup is done)
        self.prefetch_buffer.put(operation)
        return True

    def terminate_prefetch(self, operation: PrefetchOperation) -> tuple[int, list[str]]:
        operation.mark_terminate()
        return operation.completed_tokens, operation.hash_value

    def write_storage(
        self,
        host_indices: torch.Tensor,
        token_ids: list[int],
        hash_value: list[str] | None = None,
        last_hash: str | None = None,
    ) -> int:
        """Queue a backup of host pages to L3 (after write-through); returns the operation id."""
        operation = StorageOperation(host_indices, token_ids, last_hash, hash_value)
        self.backup_queue.put(operation)
        return operation.id

    def append_host_mem_release(self, host_indices: torch.Tensor) -> None:
        for page in host_indices.split(self.page_size):
            self.host_mem_release_queue.put(page)

    def storage_queue_sizes(self) -> dict[str, int]:
        return {name: getattr(self, name).qsize() for name in STORAGE_QUEUES}

    def drain_queue(self, name: str, count: int, timeout: float | None = None) -> list[Any]:
        """Take exactly `count` items, blocking until this rank's own thread produced them
        (every rank consumes the agreed count). Raises TimeoutError past `timeout` seconds,
        RuntimeError if the threads stop while waiting."""
        queue: Queue = getattr(self, name)
        deadline = None if timeout is None else time.monotonic() + timeout
        items: list[Any] = []
        while len(items) < count:
            if self.storage_stop_event.is_set():
                raise RuntimeError(f"storage threads stopped while draining {name}")
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"{name}: got {len(items)} of {count} after {timeout}s")
            try:
                items.append(queue.get(timeout=0.05))
            except Empty:
                continue
        return items

    def consume_prefetch_hits(
        self, count: int, timeout: float | None = None
    ) -> list[PrefetchOperation]:
        """Drain `count` hit-queried operations; their hit lengths become this step's evidence."""
        return self._apply_hits(self.drain_queue("prefetch_hit_queue", count, timeout))

    def _apply_hits(self, operations: list[PrefetchOperation]) -> list[PrefetchOperation]:
        for op in operations:
            self._step["l3_hit_len"][op.request_id] = op.storage_hit_count
            self._step["l3_hit_len_local"][op.request_id] = op.storage_hit_count_local
        return operations

    def consume_prefetch_acks(self, count: int, timeout: float | None = None) -> list[PrefetchAck]:
        """Drain `count` prefetch acks and apply them to their operations."""
        return self._apply_acks(self.drain_queue("ack_prefetch_queue", count, timeout))

    def _apply_acks(self, acks: list[PrefetchAck]) -> list[PrefetchAck]:
        for ack in acks:
            if ack.completed_req:
                ack.operation.io_done = True
            elif ack.completed_tokens is not None:
                ack.operation.completed_tokens = ack.completed_tokens
                self._step["l3_progress"][ack.rid] = ack.completed_tokens
                self._step["l3_progress_local"][ack.rid] = ack.completed_tokens_local
        return acks

    def drain_storage_control_queues(self, timeout: float | None = None) -> dict[str, list]:
        """Consume the four control queues by counts every rank agrees on (SGLang's
        HiRadixCache.drain_storage_control_queues). l3-hit=min: PP0's sizes, MIN over TP,
        relayed down the PP chain (#27010); a stage holding fewer blocks until its own threads
        produce them. local (legacy): each stage drains its own sizes, MIN over TP only.
        Applies prefetch hits/acks to their operations and frees released host pages; returns
        what was drained for the tree (hits to allocate or revoke, backup acks to unprotect)."""
        relay = self.l3_hit_min
        decides = not relay or self.comm.pp_rank == 0
        sizes = [getattr(self, name).qsize() if decides else 0 for name in CONTROL_QUEUES]
        counts = torch.tensor(sizes, dtype=torch.int64)
        if decides:
            self.comm.all_reduce_tp(counts, "min")
        if relay:
            self.comm.pp_sync(counts)
        agreed = dict(zip(CONTROL_QUEUES, counts.tolist(), strict=True))
        self._step["storage_counts"] = agreed
        drained = {name: self.drain_queue(name, n, timeout) for name, n in agreed.items()}
        self._apply_hits(drained["prefetch_hit_queue"])
        self._apply_acks(drained["ack_prefetch_queue"])
        for pages in drained["host_mem_release_queue"]:
            self.host_pool.free(pages)
        return drained

    def can_terminate_prefetch(self, operation: PrefetchOperation) -> bool:
        """This rank's view of the prefetch stop policy (the caller makes it agree)."""
        if self.prefetch_policy == "best_effort":
            return True
        expected = len(operation.hash_value) * self.page_size
        completed = operation.io_done or (
            operation.host_indices is not None and operation.completed_tokens >= expected
        )
        if self.prefetch_policy == "wait_complete" or completed:
            return completed
        elapsed = self.clock() - operation.start_time
        return elapsed > self.timeout.timeout_s(len(operation.token_ids))

    # ---- evidence -------------------------------------------------------------------------

    def _fault(self, op: str, key: str, error: BaseException) -> None:
        logger.error("HiCache storage %s failed for %s: %r", op, key, error)
        with self._faults_lock:
            self._faults.append(StorageFault(op, key, f"{type(error).__name__}: {error}"))

    def drain_storage_faults(self) -> list[StorageFault]:
        """Faults from the threads and from the backend since the last call."""
        with self._faults_lock:
            faults, self._faults = self._faults, []
        return faults + self.storage.drain_faults()

    def drain_step_evidence(self) -> dict[str, Any]:
        """Per-step jsonl keys (docs/evidence.md): L3 hit length and progress per rid, after
        consensus and as this rank saw them, consumed since the last call, plus storage faults."""
        step, self._step = self._step, _empty_step()
        return {**step, "storage_faults": [f.to_json() for f in self.drain_storage_faults()]}

    def probe_stats(self) -> dict[str, Any]:
        return {
            "queues": self.storage_queue_sizes(),
            "storage": dict(self.stats),
            "sync_received": dict(self.sync_received),
            "prefetch_tokens_occupied": self.prefetch_tokens_occupied,
            "threads_alive": sum(t.is_alive() for t in self._threads),
        }
