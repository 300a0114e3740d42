"""Mirrors the storage records of sglang/srt/managers/cache_controller.py: the operations and
acks that travel between the scheduler and the L3 threads, and the prefetch timeout budget."""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass

import torch

_op_ids = itertools.count()  # next() on itertools.count is atomic under the GIL


class StorageOperation:
    """One L2<->L3 transfer. `hash_value` holds the page keys; `host_indices` the host slots
    (None until allocated). `completed_tokens`: for a backup, tokens written (backup thread);
    for a prefetch, the agreed progress the scheduler has consumed from `ack_prefetch_queue`."""

    def __init__(
        self,
        host_indices: torch.Tensor | None,
        token_ids: list[int],
        last_hash: str | None = None,
        hash_value: list[str] | None = None,
    ) -> None:
        self.host_indices = host_indices
        self.token_ids = token_ids
        self.last_hash = last_hash
        self.hash_value = hash_value if hash_value is not None else []
        self.completed_tokens = 0
        self.id = next(_op_ids)
        # The scheduler step that queued the operation's current stage (prefetch lookup, then
        # its reads): the storage hook points carry it, so faults fire by issuing step.
        self.step = 0

    def __lt__(self, other: StorageOperation) -> bool:
        return self.id < other.id


class PrefetchOperation(StorageOperation):
    """A prefetch of `token_ids` from L3. `start_time` is read from the rank's own clock, so a
    timeout decision is rank-local (the legacy hazard). Thread ownership of the fields:
    prefetch thread: `storage_hit_count_local`, `storage_hit_count`, `hash_value`,
    `all_hash_values`; IO thread: `completed_tokens_local`; scheduler: the rest."""

    def __init__(
        self, request_id: str, token_ids: list[int], start_time: float, last_hash: str | None = None
    ) -> None:
        super().__init__(None, token_ids, last_hash)
        self.request_id = request_id
        self.start_time = start_time
        self.storage_hit_count = 0  # after consensus (l3-hit=min) or the local value
        self.storage_hit_count_local = 0  # what this rank's batch_exists said
        self.all_hash_values: list[str] = []
        self.completed_tokens_local = 0  # what this rank's reads achieved
        self.io_done = False  # the completion ack was consumed by the scheduler
        self._lock = threading.Lock()
        self._terminated_flag = False

    def mark_terminate(self) -> None:
        with self._lock:
            self._terminated_flag = True

    def is_terminated(self) -> bool:
        with self._lock:
            return self._terminated_flag


@dataclass(slots=True)
class PrefetchAck:
    """Progress of one prefetch: one per read batch (`completed_tokens` = pages so far x page
    size, agreed by the sync thread under l3-progress=min), then one with `completed_req`."""

    rid: str
    operation: PrefetchOperation
    completed_tokens: int | None = None
    completed_tokens_local: int | None = None
    completed_req: bool = False


@dataclass(frozen=True, slots=True)
class PrefetchTimeoutConfig:
    """`timeout` policy budget: min(max_s, base_s + per_ki_token_s * tokens / 1024)."""

    base_s: float = 2.0
    per_ki_token_s: float = 0.1
    max_s: float = 30.0

    def timeout_s(self, num_tokens: int) -> float:
        return min(self.max_s, self.base_s + self.per_ki_token_s * num_tokens / 1024)
