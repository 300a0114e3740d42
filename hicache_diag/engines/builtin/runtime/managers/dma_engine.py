"""The copy engine between the device KV pool and the host pool; ours, no upstream twin.

On CPU a real thread plays the CUDA copy stream: it takes ops in FIFO order, copies K and V layer
by layer, and completes one event per layer (the last one is the op's finish event), so the
forward can wait per layer and `ack.finish_event.query()` / `.synchronize()` behave like CUDA
events. Before completing an op it sleeps `hooks.apply("dma_complete", 0.0, ...)` seconds: the
dma-delay fault point, with the step that submitted the op (not the scheduler's step when the
copy thread gets to it), so a fault's step window and draws do not depend on thread timing.
FIFO order means acks become ready in queue order, as on one stream.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from hicache_diag.engines.builtin.runtime.mem_cache.memory_pool import MHATokenToKVPool
    from hicache_diag.engines.builtin.runtime.mem_cache.memory_pool_host import HostKVCache
    from hicache_diag.faults.hooks import Hooks

SWITCH_INTERVAL_S = 1e-4


class DmaEvent:
    """A one-shot completion flag with CUDA-event semantics; set only by the DMA thread."""

    __slots__ = ("_done", "error")

    def __init__(self, done: bool = False) -> None:
        self._done = threading.Event()
        self.error: BaseException | None = None
        if done:
            self._done.set()

    def query(self) -> bool:
        return self._done.is_set()

    def synchronize(self) -> None:
        self._done.wait()
        if self.error is not None:
            raise RuntimeError(f"DMA op failed: {self.error!r}") from self.error

    def complete(self, error: BaseException | None = None) -> None:
        self.error = error
        self._done.set()


@dataclass
class DmaOp:
    direction: str  # "write" (device -> host) or "load" (host -> device)
    device_indices: torch.Tensor
    host_indices: torch.Tensor
    layer_events: list[DmaEvent]
    start_event: DmaEvent = field(default_factory=DmaEvent)
    step: int = 0  # the scheduler step that submitted this op

    @property
    def finish_event(self) -> DmaEvent:
        return self.layer_events[-1]


class DmaEngine:
    """One copy thread per rank. `submit` is called on the scheduler thread; `shutdown` joins."""

    def __init__(
        self, kv_pool: MHATokenToKVPool, host_pool: HostKVCache, hooks: Hooks | None = None
    ) -> None:
        self.kv_pool, self.host_pool, self.hooks = kv_pool, host_pool, hooks
        # A copy engine runs beside the scheduler; a Python thread only runs when it holds the
        # GIL, which by default it may wait 5 ms for after every torch op. Shorten the switch
        # interval of this (rank) process so a small copy finishes within a step, as on a GPU.
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
        self._ops: queue.Queue[DmaOp | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="hicache-dma", daemon=True)
        self._thread.start()

    def submit(
        self,
        direction: str,
        device_indices: torch.Tensor,
        host_indices: torch.Tensor,
        layer_events: list[DmaEvent] | None = None,
    ) -> DmaOp:
        events = layer_events or [DmaEvent() for _ in range(self.kv_pool.layer_num)]
        step = self.hooks.step if self.hooks is not None else 0  # submit runs on the scheduler
        op = DmaOp(direction, device_indices, host_indices, events, step=step)
        self._ops.put(op)
        return op

    def _loop(self) -> None:
        while (op := self._ops.get()) is not None:
            op.start_event.complete()
            try:
                self._run(op)
            except BaseException as exc:  # noqa: BLE001 - surface it at synchronize(), never hang
                for ev in op.layer_events:
                    if not ev.query():
                        ev.complete(exc)

    def _run(self, op: DmaOp) -> None:
        delay = 0.0
        if self.hooks is not None:
            n = op.device_indices.numel()
            delay = float(
                self.hooks.apply(
                    "dma_complete", 0.0, direction=op.direction, num_tokens=n, step=op.step
                )
            )
        last = len(op.layer_events) - 1
        for layer, event in enumerate(op.layer_events):
            self._copy_layer(op, layer)
            if layer < last:
                event.complete()
        if delay > 0:
            time.sleep(delay)
        op.finish_event.complete()

    def _copy_layer(self, op: DmaOp, layer: int) -> None:
        dev_k, dev_v = self.kv_pool.k_buffer[layer], self.kv_pool.v_buffer[layer]
        host_k, host_v = self.host_pool.k_buffer[layer], self.host_pool.v_buffer[layer]
        d, h = op.device_indices, op.host_indices
        if op.direction == "write":
            host_k[h], host_v[h] = dev_k[d].cpu(), dev_v[d].cpu()
        else:
            dev_k[d], dev_v[d] = host_k[h].to(dev_k.device), host_v[h].to(dev_v.device)

    def shutdown(self, timeout: float = 5.0) -> None:
        if self._thread.is_alive():
            self._ops.put(None)
            self._thread.join(timeout)
