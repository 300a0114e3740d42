"""The hook points of `hicache_diag.hooks`, placed at SGLang's real functions (targets.py).

Every wrapper is installed at import time in every process of the launch (SGLang imports many
of these names with `from x import f`, so a later patch would miss them) and does nothing until
the scheduler entry of this process has set `STATE.hooks`. Values, contexts and units are the
builtin runtime's, so `faults/` installs unchanged into either engine.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hicache_diag.link_delay import message
from hicache_diag.sglang_plugin.post_import import patch_attr, when_imported

if TYPE_CHECKING:
    from hicache_diag.hooks import Hooks
    from hicache_diag.side_pool import SidePool


@dataclass
class _State:
    hooks: Hooks | None = None  # of this scheduler process
    recorder: Any = None  # recorder.StepRecorder
    side_pool: SidePool | None = None  # made on the first host_hold


STATE = _State()


def reset() -> None:
    STATE.hooks = STATE.recorder = STATE.side_pool = None


def _apply(point: str, value: Any, **ctx: Any) -> Any:
    hooks = STATE.hooks
    return value if hooks is None else hooks.apply(point, value, **ctx)


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


def _late_completion(controller: Any, direction: str, queue: list, first: int, result: Any,
                     ready_at: float) -> None:  # fmt: skip
    for i in range(first, len(queue)):
        queue[i] = queue[i]._replace(finish_event=_late(queue[i].finish_event, ready_at))
    allocator = getattr(controller, "mem_pool_device_allocator", None)
    if queue and hasattr(allocator, "set_hicache_transfer_done_event"):  # 0.5.2x
        allocator.set_hicache_transfer_done_event((id(controller), direction),
                                                  queue[-1].finish_event)  # fmt: skip
    if direction == "load" and isinstance(result, int) and result >= 0:
        producer = controller.layer_done_counter.events[result]
        producer.load_events = [_late(e, ready_at) for e in producer.load_events]


def _wrap_start(direction: str, queue_name: str):
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
            delay = _apply("dma_complete", 0.0, direction=direction, num_tokens=num_tokens)
            if delay > 0:
                _late_completion(self, direction, queue, first, result, time.monotonic() + delay)
            return result

        return wrapper

    return make


def _wrap_layer_wait(original):
    @functools.wraps(original)
    def wait(self, layer_index, *args, **kwargs):
        event = self.load_events[layer_index]
        if isinstance(event, DelayedEvent):  # the stream would wait on the late copy
            waited = event.wait_ready()
            if waited > 0 and STATE.recorder is not None:
                STATE.recorder.waited("dma_wait_ms", waited)
        return original(self, layer_index, *args, **kwargs)

    return wait


def _host_pool(tree: Any) -> Any:
    return getattr(getattr(tree, "cache_controller", None), "mem_pool_host", None)


def _wrap_evict_host(original):
    @functools.wraps(original)
    def evict_host(self, *args, **kwargs):
        pool = _host_pool(self)
        before = pool.available_size() if pool is not None else 0
        result = original(self, *args, **kwargs)
        if STATE.recorder is not None and pool is not None:
            # Freed slots, read off the pool: 0.5.1x's evict_host returns nothing.
            STATE.recorder.count("host_evicted", int(pool.available_size()) - int(before))
            STATE.recorder.count("host_evict_calls", 1)
        return result

    return evict_host


def _wrap_backup(need_of):
    """The backup decision: `_execute_kv_backup` (0.5.18+) returns None, or `write_backup`
    (0.5.1x) returns 0 after its evict_host + retry, when this rank's host pool is short."""

    def make(original):
        @functools.wraps(original)
        def backup(self, *args, **kwargs):
            recorder, pool = STATE.recorder, _host_pool(self)
            if recorder is None or pool is None:
                return original(self, *args, **kwargs)
            free = int(pool.available_size())
            calls, failed = recorder.peek("host_evict_calls"), recorder.peek("host_alloc_failed")
            evicted = recorder.peek("host_evicted")
            result = original(self, *args, **kwargs)
            tried = (recorder.peek("host_evict_calls") > calls
                     or recorder.peek("host_alloc_failed") > failed)  # fmt: skip
            # A tensor (the host indices) or None in 0.5.18+; an int (tokens) in 0.5.1x.
            skipped = result is None or (isinstance(result, int) and result == 0 and tried)
            if skipped:
                recorder.shortage(
                    need=need_of(args, kwargs), free=free,
                    evicted=recorder.peek("host_evicted") - evicted,
                    evict_calls=recorder.peek("host_evict_calls") - calls,
                )  # fmt: skip
            return result

        return backup

    return make


def _wrap_finish_write_ack(original):
    """Which node's write-through each rank finished (and unlocked) this step: the ledger."""

    @functools.wraps(original)
    def _finish_write_through_ack(self, ack_id, *args, **kwargs):
        if STATE.recorder is not None:
            STATE.recorder.acked_node(ack_id)
        return original(self, ack_id, *args, **kwargs)

    return _finish_write_through_ack


def _wrap_load_back(original):
    """device-alloc-fail: a concurrent consumer holds device slots during this load-back."""

    @functools.wraps(original)
    def load_back(self, *args, **kwargs):
        hooks = STATE.hooks
        allocator = getattr(self, "token_to_kv_pool_allocator", None)
        if hooks is None or allocator is None or not hooks.has("device_hold"):
            return original(self, *args, **kwargs)
        from hicache_diag.side_pool import SidePool

        side = SidePool()
        free = int(allocator.available_size())
        held = side.settle(allocator, int(hooks.apply("device_hold", 0, free=free, need=None)))
        try:
            result = original(self, *args, **kwargs)
        finally:
            side.settle(allocator, 0)
        declined = result is None or result is False
        if held and STATE.recorder is not None:
            STATE.recorder.count("device_held", held)
            STATE.recorder.count("load_back_declined", int(declined))
        return result

    return load_back


def _need_execute(args, kwargs) -> int:
    value = args[1] if len(args) > 1 else kwargs.get("device_value")
    return len(value) if value is not None else 0


def _need_write_backup(args, kwargs) -> int:
    node = args[0] if args else kwargs.get("node")
    value = getattr(node, "value", None)
    return len(value) if value is not None else 0


def _wrap_host_alloc(original):
    @functools.wraps(original)
    def alloc(self, need_size, *args, **kwargs):
        if not _apply("host_alloc", True, num_tokens=int(need_size)):
            result = None  # what the pool returns when it is short
        else:
            result = original(self, need_size, *args, **kwargs)
        recorder = STATE.recorder
        if recorder is not None:
            if result is None:
                recorder.count("host_alloc_failed", 1)
            recorder.source_read("host-alloc", int(need_size))  # source_probes
            recorder.source_decided("host-alloc", int(result is not None))
        return result

    return alloc


def _wrap_time_counter(original):
    @functools.wraps(original)
    def get_and_increase_time_counter():
        return _apply("now", original())

    return get_and_increase_time_counter


def _wrap_batch_exists(original):
    @functools.wraps(original)
    def batch_exists(self, keys, *args, **kwargs):
        found = original(self, keys, *args, **kwargs)
        return _apply("storage_exists", found, num_pages=len(keys))

    return batch_exists


def _wrap_file_get(original):
    @functools.wraps(original)
    def get(self, key, *args, **kwargs):
        if not _apply("storage_read", True, page_index=None, num_pages=1):
            return None  # what HiCacheFile.get returns for a missing page
        return original(self, key, *args, **kwargs)

    return get


def _wrap_pyobj_send(original):
    @functools.wraps(original)
    def point_to_point_pyobj(data, rank, group=None, src=0, dst=1, *args, **kwargs):
        if rank != src:
            return original(data, rank, group, src, dst, *args, **kwargs)
        with message("reqs"):  # p2p-delay: the link delivers late (hicache_diag/link_delay.py)
            return original(data, rank, group, src, dst, *args, **kwargs)

    return point_to_point_pyobj


def _wrap_tensor_dict_send(original):
    @functools.wraps(original)
    def send_tensor_dict(self, tensor_dict, *args, **kwargs):
        msg = tensor_dict.get("__msg_type__", "proxy") if isinstance(tensor_dict, dict) else None
        with message(str(msg)):
            return original(self, tensor_dict, *args, **kwargs)

    return send_tensor_dict


def _wrap_pp_sync(original):
    """HiCache's own PP relay (#27285): PP0's ready-ack counts, isent down the chain."""

    @functools.wraps(original)
    def _pp_sync(self, *args, **kwargs):
        with message("sync"):
            return original(self, *args, **kwargs)

    return _pp_sync


def _wrap_maybe_reap(original):
    """The session reap tick (`session_clock`): when this rank's tick falls due, a handler may
    hold it back by some seconds, once; the later ticks keep that phase (faults/session_clock.py).
    Sessions the reap closed are counted for the recorder (`sessions_closed`)."""

    @functools.wraps(original)
    def maybe_reap(self, now, *args, **kwargs):
        recorder = STATE.recorder
        if recorder is not None and isinstance(now, int | float):  # source_probes: the clock
            recorder.source_read("session-clock", round(now, 3))
        interval = args[0] if args else kwargs.get("interval", 1.0)
        hold = self.__dict__.get("_hicache_diag_hold_until")
        if hold is not None:
            if now < hold:
                return None
            del self.__dict__["_hicache_diag_hold_until"]
        elif now - self._last_reap_time > interval:
            lag = _apply("session_clock", 0.0)
            if lag > 0:
                self.__dict__["_hicache_diag_hold_until"] = now + lag
                return None
        before = len(self.sessions)
        result = original(self, now, *args, **kwargs)
        closed = before - len(self.sessions)
        if closed > 0 and STATE.recorder is not None:
            STATE.recorder.count("sessions_closed", closed)
            STATE.recorder.source_decided("session-clock", closed)
        return result

    return maybe_reap


def _wrap_flush_handle(original):
    """A deferred flush's deadline (`flush_clock`): seconds added to this rank's own
    `time.monotonic() + timeout_s`, as if the request had reached it that much later."""

    @functools.wraps(original)
    def handle(self, recv_req, *args, **kwargs):
        had = self._pending is not None
        result = original(self, recv_req, *args, **kwargs)
        pending = self._pending
        if pending is not None and not had:
            timeout_s = float(getattr(recv_req, "timeout_s", 0.0) or 0.0)
            delta = _apply("flush_clock", 0.0, timeout_s=timeout_s)
            if delta:
                self._pending = (pending[0], pending[1] + delta)
        return result

    return handle


def _on(module: str, owner: str | None, name: str, make) -> None:
    def patch(mod) -> None:
        target = getattr(mod, owner, None) if owner else mod
        if target is not None and hasattr(target, name):  # a release may lack it: targets.py
            patch_attr(target, name, make)

    when_imported(module, patch)


def install_hook_points() -> None:
    cc = "sglang.srt.managers.cache_controller"
    _on(cc, "HiCacheController", "start_writing", _wrap_start("write", "ack_write_queue"))
    _on(cc, "HiCacheController", "start_loading", _wrap_start("load", "ack_load_queue"))
    _on(cc, "LayerLoadingEvent", "wait", _wrap_layer_wait)
    _on("sglang.srt.mem_cache.pool_host.base", "HostKVCache", "alloc", _wrap_host_alloc)
    _on("sglang.srt.mem_cache.memory_pool_host", "HostKVCache", "alloc", _wrap_host_alloc)
    _on(
        "sglang.srt.mem_cache.unified_cache.components.base",
        None,
        "get_and_increase_time_counter",
        _wrap_time_counter,
    )
    for module, tree in (("sglang.srt.mem_cache.unified_radix_cache", "UnifiedRadixCache"),
                         ("sglang.srt.mem_cache.hiradix_cache", "HiRadixCache")):  # fmt: skip
        _on(module, tree, "evict_host", _wrap_evict_host)
        _on(module, tree, "load_back", _wrap_load_back)
        _on(module, tree, "_pp_sync", _wrap_pp_sync)
        _on(module, tree, "_finish_write_through_ack", _wrap_finish_write_ack)
    _on("sglang.srt.mem_cache.unified_radix_cache", "UnifiedRadixCache", "_execute_kv_backup",
        _wrap_backup(_need_execute))  # fmt: skip
    _on("sglang.srt.mem_cache.hiradix_cache", "HiRadixCache", "write_backup",
        _wrap_backup(_need_write_backup))  # fmt: skip
    storage = "sglang.srt.mem_cache.hicache_storage"
    _on(storage, "HiCacheStorage", "batch_exists", _wrap_batch_exists)
    _on(storage, "HiCacheFile", "get", _wrap_file_get)
    _on("sglang.srt.utils.common", None, "point_to_point_pyobj", _wrap_pyobj_send)
    _on(
        "sglang.srt.distributed.parallel_state",
        "GroupCoordinator",
        "send_tensor_dict",
        _wrap_tensor_dict_send,
    )
    _on("sglang.srt.session.session_controller", "SessionController", "maybe_reap",
        _wrap_maybe_reap)  # fmt: skip
    _on("sglang.srt.managers.scheduler_components.flush_wrapper", "SchedulerFlushWrapper",
        "handle", _wrap_flush_handle)  # fmt: skip
