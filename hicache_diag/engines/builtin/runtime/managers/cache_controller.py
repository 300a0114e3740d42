"""Mirrors sglang/srt/managers/cache_controller.py (L1<->L2 half): queues, acks, layer events.

Everything here runs on the scheduler thread; the copies themselves run on the DMA engine's
thread. The controller never evicts: `write` returns None when the host pool is short and `load`
when the device pool is short, and the tree decides what to do (as upstream).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from hicache_diag.engines.builtin.runtime.managers.dma_engine import DmaEngine, DmaEvent

if TYPE_CHECKING:
    from hicache_diag.engines.builtin.runtime.mem_cache.allocator import TokenToKVPoolAllocator
    from hicache_diag.engines.builtin.runtime.mem_cache.memory_pool import MHATokenToKVPool
    from hicache_diag.engines.builtin.runtime.mem_cache.memory_pool_host import HostKVCache
    from hicache_diag.faults.hooks import Hooks


@dataclass
class CacheOperation:
    host_indices: torch.Tensor
    device_indices: torch.Tensor
    node_id: int


@dataclass
class HiCacheAck:
    start_event: DmaEvent
    finish_event: DmaEvent
    node_ids: list[int]
    num_tokens: int
    ack_id: int = 0
    issued_at: float = field(default_factory=time.monotonic)  # for ack_pending_ms (evidence)


@dataclass
class LayerLoadingEvent:
    num_layers: int
    done: bool = False
    load_events: list[DmaEvent] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.load_events = [DmaEvent(self.done) for _ in range(self.num_layers)]

    @property
    def finish_event(self) -> DmaEvent:
        return self.load_events[-1]


class LayerDoneCounter:
    """Three rotating producer slots ("extra producer and consumer counters for overlap mode").
    The forward of the batch whose consumer index is set waits per layer in `wait_until`."""

    num_counters = 3

    def __init__(self, num_layers: int) -> None:
        self.num_layers = num_layers
        self.events = [LayerLoadingEvent(num_layers, done=True) for _ in range(self.num_counters)]
        self.producer_index = -1
        self.consumer_index = -1
        self.wait_s = 0.0  # the forward's time blocked on load-back copies (dma_wait_ms)

    def update_producer(self) -> int:
        nxt = (self.producer_index + 1) % self.num_counters
        # Upstream asserts the slot's last load finished; we wait instead, so a delayed DMA
        # stalls (as on a fixed build) rather than raising an error no production build shows.
        self.events[nxt].finish_event.synchronize()
        self.events[nxt] = LayerLoadingEvent(self.num_layers)
        self.producer_index = nxt
        return nxt

    def set_consumer(self, index: int) -> None:
        self.consumer_index = index

    def wait_until(self, layer_index: int) -> None:
        if self.consumer_index >= 0:
            event = self.events[self.consumer_index].load_events[layer_index]
            if event.query():
                return
            start = time.monotonic()
            event.synchronize()
            self.wait_s += time.monotonic() - start

    def take_wait_s(self) -> float:
        waited, self.wait_s = self.wait_s, 0.0
        return waited


class HiCacheController:
    """Owns `write_queue`, `load_queue`, `ack_write_queue`, `ack_load_queue` and the DMA engine.
    `events` collects timeline records (`issued` / `queued`) until the tree drains them."""

    def __init__(
        self,
        allocator: TokenToKVPoolAllocator,
        kv_pool: MHATokenToKVPool,
        host_pool: HostKVCache,
        hooks: Hooks | None = None,
    ) -> None:
        self.mem_pool_device_allocator = allocator
        self.mem_pool_device, self.mem_pool_host = kv_pool, host_pool
        self.write_queue: list[CacheOperation] = []
        self.load_queue: list[CacheOperation] = []
        self.ack_write_queue: list[HiCacheAck] = []
        self.ack_load_queue: list[HiCacheAck] = []
        self.layer_done_counter = LayerDoneCounter(kv_pool.layer_num)
        kv_pool.register_layer_transfer_counter(self.layer_done_counter)
        self.dma = DmaEngine(kv_pool, host_pool, hooks)
        self.next_ack_id = {"write": 0, "load": 0}
        self.events: list[dict[str, Any]] = []

    def write(
        self,
        device_indices: torch.Tensor,
        node_id: int,
        host_indices: torch.Tensor | None = None,
        tag: dict[str, Any] | None = None,
    ) -> torch.Tensor | None:
        """Back up device slots to host; host slots come from the pool unless reserved already."""
        if host_indices is None:
            host_indices = self.mem_pool_host.alloc(len(device_indices))
            if host_indices is None:
                return None
        self.write_queue.append(CacheOperation(host_indices, device_indices, node_id))
        self._event("write", "issued", node_ids=[node_id], **(tag or {}))
        self.start_writing()
        return host_indices

    def start_writing(self) -> None:
        if not self.write_queue:
            return
        ops, self.write_queue = self.write_queue, []
        host, dev, ids = _merge(ops)
        op = self.dma.submit("write", dev, host)
        self.ack_write_queue.append(self._ack("write", op.start_event, op.finish_event, ids, dev))

    def load(self, host_indices: torch.Tensor, node_id: int) -> torch.Tensor | None:
        """Reserve device slots for a load-back; the copy starts at `start_loading`."""
        device_indices = self.mem_pool_device_allocator.alloc(len(host_indices))
        if device_indices is None:
            return None
        self.load_queue.append(CacheOperation(host_indices, device_indices, node_id))
        self._event("load", "issued", node_ids=[node_id])
        return device_indices

    def start_loading(self) -> int:
        """Submit the queued loads as one op; returns the producer index (-1: nothing queued)."""
        if not self.load_queue:
            return -1
        ops, self.load_queue = self.load_queue, []
        host, dev, ids = _merge(ops)
        producer_id = self.layer_done_counter.update_producer()
        producer = self.layer_done_counter.events[producer_id]
        op = self.dma.submit("load", dev, host, producer.load_events)
        self.ack_load_queue.append(self._ack("load", op.start_event, op.finish_event, ids, dev))
        return producer_id

    def _ack(self, kind: str, start: DmaEvent, finish: DmaEvent, ids: list[int], dev) -> HiCacheAck:
        ack = HiCacheAck(start, finish, ids, len(dev), self.next_ack_id[kind])
        self.next_ack_id[kind] += 1
        self._event(kind, "queued", node_ids=ids, ack_id=ack.ack_id)
        return ack

    def _event(self, kind: str, phase: str, **detail: Any) -> None:
        detail.setdefault("ack_id", self.next_ack_id[kind])  # the ack this op will belong to
        self.events.append({"event": kind, "phase": phase, **detail})

    def queue_depths(self) -> dict[str, int]:
        return {
            "write_queue": len(self.write_queue),
            "load_queue": len(self.load_queue),
            "ack_write_queue": len(self.ack_write_queue),
            "ack_load_queue": len(self.ack_load_queue),
        }

    def shutdown(self) -> None:
        self.dma.shutdown()


def _merge(ops: list[CacheOperation]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    host = torch.cat([o.host_indices for o in ops])
    dev = torch.cat([o.device_indices for o in ops])
    return host, dev, [o.node_id for o in ops]
