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
from typing import Any

from hicache_diag.sglang_plugin.post_import import patch_attr, when_imported


@dataclass
class _State:
    hooks: Any = None  # hicache_diag.hooks.Hooks of this scheduler process
    recorder: Any = None  # recorder.StepRecorder


STATE = _State()


def reset() -> None:
    STATE.hooks = STATE.recorder = None


def _apply(point: str, value: Any, **ctx: Any) -> Any:
    hooks = STATE.hooks
    return value if hooks is None else hooks.apply(point, value, **ctx)


class DelayedEvent:
    """A finish event that reports ready only after `ready_at` (a slow DMA on this rank): the
    ack stays out of this rank's ready count and `synchronize()` waits, as on a slow stream."""

    def __init__(self, inner: Any, ready_at: float) -> None:
        self._inner, self.ready_at = inner, ready_at

    def query(self) -> bool:
        return time.monotonic() >= self.ready_at and self._inner.query()

    def synchronize(self) -> None:
        delay = self.ready_at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        self._inner.synchronize()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _delay_new_acks(queue: list, first: int, direction: str) -> None:
    for i in range(first, len(queue)):
        ack = queue[i]
        # Releases before 0.5.2x carry no num_tokens on HiCacheAck (start, finish, node_ids).
        num_tokens = getattr(ack, "num_tokens", None)
        delay = _apply("dma_complete", 0.0, direction=direction, num_tokens=num_tokens)
        if STATE.recorder is not None and num_tokens is not None:
            STATE.recorder.count(f"{direction}_backs", num_tokens)
        if delay > 0:
            ready_at = time.monotonic() + delay
            queue[i] = ack._replace(finish_event=DelayedEvent(ack.finish_event, ready_at))


def _wrap_start(direction: str, queue_name: str):
    def make(original):
        @functools.wraps(original)
        def wrapper(self, *args, **kwargs):
            queue = getattr(self, queue_name)
            first = len(queue)
            result = original(self, *args, **kwargs)
            _delay_new_acks(queue, first, direction)
            return result

        return wrapper

    return make


def _wrap_host_alloc(original):
    @functools.wraps(original)
    def alloc(self, need_size, *args, **kwargs):
        if not _apply("host_alloc", True, num_tokens=int(need_size)):
            result = None  # what the pool returns when it is short
        else:
            result = original(self, need_size, *args, **kwargs)
        if result is None and STATE.recorder is not None:
            STATE.recorder.count("host_alloc_failed", 1)
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
        if rank == src:
            delay = _apply("p2p_send", 0.0, msg="reqs")
            if delay > 0:
                time.sleep(delay)
        return original(data, rank, group, src, dst, *args, **kwargs)

    return point_to_point_pyobj


def _wrap_tensor_dict_send(original):
    @functools.wraps(original)
    def send_tensor_dict(self, tensor_dict, *args, **kwargs):
        msg = tensor_dict.get("__msg_type__", "proxy") if isinstance(tensor_dict, dict) else None
        delay = _apply("p2p_send", 0.0, msg=str(msg))
        if delay > 0:
            time.sleep(delay)
        return original(self, tensor_dict, *args, **kwargs)

    return send_tensor_dict


def _wrap_maybe_reap(original):
    """The session reap tick (`session_clock`): when this rank's tick falls due, a handler may
    hold it back by some seconds, once; the later ticks keep that phase (faults/session_clock.py).
    Sessions the reap closed are counted for the recorder (`sessions_closed`)."""

    @functools.wraps(original)
    def maybe_reap(self, now, *args, **kwargs):
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
        target = getattr(mod, owner) if owner else mod
        patch_attr(target, name, make)

    when_imported(module, patch)


def install_hook_points() -> None:
    cc = "sglang.srt.managers.cache_controller"
    _on(cc, "HiCacheController", "start_writing", _wrap_start("write", "ack_write_queue"))
    _on(cc, "HiCacheController", "start_loading", _wrap_start("load", "ack_load_queue"))
    _on("sglang.srt.mem_cache.pool_host.base", "HostKVCache", "alloc", _wrap_host_alloc)
    _on("sglang.srt.mem_cache.memory_pool_host", "HostKVCache", "alloc", _wrap_host_alloc)
    _on(
        "sglang.srt.mem_cache.unified_cache.components.base",
        None,
        "get_and_increase_time_counter",
        _wrap_time_counter,
    )
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
