"""The DMA hook points (`dma_complete`): a copy's completion made late on this rank, for the ack
and the forward alike (dma-delay), and the write/load-back counts the recorder keeps."""

from __future__ import annotations

import functools
import time
from typing import Any

from hicache_diag.engines.sglang.plugin.hook_state import STATE, apply_hook


class DelayedEvent:
    """A completion event that reports ready only after `ready_at` (a slow copy on this rank).
    The same object stands in for the copy's event wherever SGLang handed it out: the ack in
    `ack_*_queue`, the allocator's `set_hicache_transfer_done_event`, and for a load-back the
    producer's per-layer events that the forward waits on (`LayerLoadingEvent.wait`) and that
    `LayerDoneCounter.update_producer` asserts on. So ack and forward see the copy late alike,
    as a slow GPU copy is (docs/faults.md, `dma-delay`)."""

    def __init__(self, inner: Any, ready_at: float) -> None:
        self._inner, self.ready_at = inner, ready_at

    @property
    def inner(self) -> Any:
        return self._inner

    def query(self) -> bool:
        return time.monotonic() >= self.ready_at and self._inner.query()

    def wait_ready(self) -> float:
        """Block until ready; returns the seconds waited (the forward's stall)."""
        delay = self.ready_at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
            return delay
        return 0.0

    def synchronize(self) -> None:
        waited = self.wait_ready()  # e.g. writing_check's wait on an ack PP0 counted ready
        if waited > 0 and STATE.recorder is not None:
            STATE.recorder.waited("ack_wait_ms", waited)
        self._inner.synchronize()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _late(event: Any, ready_at: float) -> DelayedEvent:
    return DelayedEvent(event.inner if isinstance(event, DelayedEvent) else event, ready_at)


def _pending_tokens(ops: Any) -> int | None:
    try:
        return sum(len(op.device_indices) for op in ops)
    except (TypeError, AttributeError):
        return None


def _late_completion(
    controller: Any, direction: str, queue: list, first: int, result: Any, ready_at: float
) -> None:
    for i in range(first, len(queue)):
        queue[i] = queue[i]._replace(finish_event=_late(queue[i].finish_event, ready_at))
    allocator = getattr(controller, "mem_pool_device_allocator", None)
    if queue and hasattr(allocator, "set_hicache_transfer_done_event"):  # 0.5.2x
        key = (id(controller), direction)
        allocator.set_hicache_transfer_done_event(key, queue[-1].finish_event)
    if direction == "load" and isinstance(result, int) and result >= 0:
        producer = controller.layer_done_counter.events[result]
        producer.load_events = [_late(e, ready_at) for e in producer.load_events]


def wrap_start(direction: str, queue_name: str):
    def make(original):
        @functools.wraps(original)
        def wrapper(self, *args, **kwargs):
            queue = getattr(self, queue_name)
            first = len(queue)
            num_tokens = _pending_tokens(getattr(self, f"{direction}_queue", None))
            result = original(self, *args, **kwargs)
            if len(queue) == first:
                return result  # nothing was submitted
            # Releases before 0.5.2x carry no num_tokens on HiCacheAck (start, finish, node_ids).
            num_tokens = getattr(queue[-1], "num_tokens", None) or num_tokens
            if STATE.recorder is not None and num_tokens is not None:
                STATE.recorder.count(f"{direction}_backs", num_tokens)
            delay = apply_hook("dma_complete", 0.0, direction=direction, num_tokens=num_tokens)
            if delay > 0:
                _late_completion(self, direction, queue, first, result, time.monotonic() + delay)
            return result

        return wrapper

    return make


def wrap_layer_wait(original):
    @functools.wraps(original)
    def wait(self, layer_index, *args, **kwargs):
        event = self.load_events[layer_index]
        if isinstance(event, DelayedEvent):  # the stream would wait on the late copy
            waited = event.wait_ready()
            if waited > 0 and STATE.recorder is not None:
                STATE.recorder.waited("dma_wait_ms", waited)
        return original(self, layer_index, *args, **kwargs)

    return wait
