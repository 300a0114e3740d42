"""The four L3 storage threads of SGLang's HiCacheController (managers/cache_controller.py),
with SGLang's function names; ours as a mixin of `StorageController`.

  prefetch_thread_func       prefetch_queue -> batch_exists -> [MIN "prefetch_hits"]
                             -> prefetch_hit_queue (one entry per operation, even on error)
  prefetch_io_aux_func       prefetch_buffer -> page reads -> prefetch_sync_queue
                             (one progress ack per batch even on error, then a completion ack)
  prefetch_sync_thread_func  prefetch_sync_queue -> [MIN "prefetch_completion"]
                             -> ack_prefetch_queue
  backup_thread_func         backup_queue -> page writes -> ack_backup_queue
Each MIN runs in the thread that produced the value, on that thread's own gloo group (#27010):
two threads never share one communicator.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from queue import Empty, Queue
from typing import Any

import torch

from hicache_diag.engines.builtin.runtime.distributed.comm import HiCacheComm
from hicache_diag.engines.builtin.runtime.managers.storage_operation import (
    PrefetchAck,
    PrefetchOperation,
    StorageOperation,
)
from hicache_diag.engines.builtin.runtime.managers.storage_pages import HostPages
from hicache_diag.engines.builtin.runtime.mem_cache.hicache_storage import (
    HiCacheStorage,
    get_page_hashes,
)

logger = logging.getLogger(__name__)


class StorageThreadsMixin:
    """Thread bodies. The host class provides the queues, `storage`, `comm`, `host_pages`,
    `page_size`, `storage_batch_size`, `l3_hit_min`, `l3_progress_min`, `stats`,
    `storage_stop_event` and `_fault(op, key, error)`."""

    storage: HiCacheStorage
    comm: HiCacheComm
    host_pages: HostPages
    page_size: int
    storage_batch_size: int
    l3_hit_min: bool
    l3_progress_min: bool
    stats: dict[str, int]
    sync_received: dict[str, int | None]
    storage_stop_event: threading.Event
    prefetch_queue: Queue
    prefetch_hit_queue: Queue
    prefetch_buffer: Queue
    prefetch_sync_queue: Queue
    ack_prefetch_queue: Queue
    backup_queue: Queue
    ack_backup_queue: Queue

    def _fault(self, op: str, key: str, error: BaseException) -> None:
        raise NotImplementedError

    def _serve(self, queue: Queue, handle: Callable[[Any], None]) -> None:
        """A thread's loop: take items until stopped; an unexpected error becomes a fault and
        the loop goes on (SGLang's `prefetch_io_aux_func` catches only `Empty`: a short read of
        HiCacheFile kills the daemon thread silently, and its request never finishes prefetch)."""
        while not self.storage_stop_event.is_set():
            try:
                item = queue.get(timeout=0.1)
            except Empty:
                continue
            if item is None:
                continue
            try:
                handle(item)
            except Exception as e:
                self._fault("thread", threading.current_thread().name, e)

    # ---- prefetch thread ------------------------------------------------------------------

    def prefetch_thread_func(self) -> None:
        self._serve(self.prefetch_queue, self._prefetch_one)

    def _prefetch_one(self, operation: PrefetchOperation) -> None:
        hash_value, hit_count = [], 0
        try:
            if not operation.is_terminated():
                hash_value, hit_count = self._storage_hit_query(operation)
        except Exception as e:
            self._fault("query", operation.request_id, e)
        operation.storage_hit_count_local = hit_count
        try:
            hit_count = self._sync_prefetch_hit_query(hit_count)
        finally:  # the scheduler waits for exactly one entry per operation
            operation.hash_value = hash_value[: hit_count // self.page_size]
            operation.storage_hit_count = len(operation.hash_value) * self.page_size
            self.stats["hit_pages_local"] += operation.storage_hit_count_local // self.page_size
            self.stats["hit_pages"] += len(operation.hash_value)
            self.sync_received["l3_hit"] = operation.storage_hit_count
            self.prefetch_hit_queue.put(operation)

    def _storage_hit_query(self, operation: PrefetchOperation) -> tuple[list[str], int]:
        page_hashes = get_page_hashes(operation.token_ids, self.page_size, operation.last_hash)
        operation.all_hash_values = page_hashes
        hash_value: list[str] = []
        for start in range(0, len(page_hashes), self.storage_batch_size):
            batch = page_hashes[start : start + self.storage_batch_size]
            hit_pages = self.storage.batch_exists(batch, step=operation.step)
            hash_value.extend(batch[:hit_pages])
            if hit_pages < len(batch):
                break
        return hash_value, len(hash_value) * self.page_size

    def _sync_prefetch_hit_query(self, hit_count: int) -> int:
        """l3-hit=min: every rank agrees on the usable prefix (#27010); local: legacy."""
        if not self.l3_hit_min:
            return hit_count
        tensor = torch.tensor([hit_count], dtype=torch.int64)
        self.comm.all_reduce_thread_group("prefetch_hits", tensor, "min")
        return int(tensor.item())

    # ---- IO thread ------------------------------------------------------------------------

    def prefetch_io_aux_func(self) -> None:
        self._serve(self.prefetch_buffer, self._prefetch_io_one)

    def _prefetch_io_one(self, operation: PrefetchOperation) -> None:
        try:
            self._page_transfer(operation)
        finally:
            ack = PrefetchAck(operation.request_id, operation, completed_req=True)
            self.prefetch_sync_queue.put(ack)

    def _page_transfer(self, operation: PrefetchOperation) -> None:
        """Read batch by batch. After a failure keep looping and still emit one ack per batch:
        the sync thread MINs per ack, so every rank must produce the same number (#27010)."""
        all_success, completed_pages = True, 0
        total = len(operation.hash_value)
        for start in range(0, total, self.storage_batch_size):
            all_success = all_success and not operation.is_terminated()
            if all_success:
                batch = operation.hash_value[start : start + self.storage_batch_size]
                hit_pages = self._page_get_batch(operation, batch, start)
                all_success = hit_pages == len(batch)
                completed_pages += hit_pages
                operation.completed_tokens_local = completed_pages * self.page_size
            ack = PrefetchAck(
                operation.request_id, operation, completed_tokens=completed_pages * self.page_size
            )
            self.prefetch_sync_queue.put(ack)

    def _page_get_batch(self, operation: PrefetchOperation, batch: list[str], start: int) -> int:
        """Leading pages of `batch` read into host memory; an error counts as zero pages."""
        try:
            targets = [self.host_pages.empty_page() for _ in batch]
            total = len(operation.hash_value)
            pages = self.storage.batch_get(
                batch, targets, page_offset=start, num_pages=total, step=operation.step
            )
            hit_pages = 0
            for i, data in enumerate(pages):
                if data is None or operation.is_terminated():
                    break
                self.host_pages.set_page(self._page_slots(operation, start + i), data)
                hit_pages += 1
            self.stats["read_pages"] += hit_pages
            return hit_pages
        except Exception as e:
            self._fault("read", operation.request_id, e)
            return 0

    def _page_slots(self, operation: StorageOperation, page: int) -> torch.Tensor:
        return operation.host_indices[page * self.page_size : (page + 1) * self.page_size]

    # ---- sync thread ----------------------------------------------------------------------

    def prefetch_sync_thread_func(self) -> None:
        self._serve(self.prefetch_sync_queue, self._prefetch_sync_one)

    def _prefetch_sync_one(self, ack: PrefetchAck) -> None:
        try:
            self._reduce_prefetch_ack(ack)
        finally:
            self.ack_prefetch_queue.put(ack)

    def _reduce_prefetch_ack(self, ack: PrefetchAck) -> None:
        """l3-progress=min: the minimal successful prefix over every rank (#27010)."""
        if ack.completed_tokens is None:
            return
        ack.completed_tokens_local = ack.completed_tokens
        if self.l3_progress_min:
            tensor = torch.tensor([ack.completed_tokens], dtype=torch.int64)
            self.comm.all_reduce_thread_group("prefetch_completion", tensor, "min")
            ack.completed_tokens = int(tensor.item())
        self.sync_received["l3_progress"] = ack.completed_tokens

    # ---- backup thread --------------------------------------------------------------------

    def backup_thread_func(self) -> None:
        self._serve(self.backup_queue, self._backup_one)

    def _backup_one(self, operation: StorageOperation) -> None:
        try:
            if not operation.hash_value:
                operation.hash_value = get_page_hashes(
                    operation.token_ids, self.page_size, operation.last_hash
                )
            self._page_backup(operation)
        except Exception as e:
            self._fault("write", f"backup op {operation.id}", e)
        finally:
            self.ack_backup_queue.put(operation)

    def _page_backup(self, operation: StorageOperation) -> None:
        for start in range(0, len(operation.hash_value), self.storage_batch_size):
            batch = operation.hash_value[start : start + self.storage_batch_size]
            data = [
                self.host_pages.get_page(self._page_slots(operation, start + i))
                for i in range(len(batch))
            ]
            if not self.storage.batch_set(batch, data):
                logger.warning("Write page to storage: %d pages failed.", len(batch))
                break
            operation.completed_tokens += self.page_size * len(batch)
            self.stats["backup_pages"] += len(batch)
