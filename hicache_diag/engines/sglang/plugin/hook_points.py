"""The hook points of `hicache_diag.faults.hooks`, placed at SGLang's real functions (targets.py).

Every wrapper is installed at import time in every process of the launch (SGLang imports many
of these names with `from x import f`, so a later patch would miss them) and does nothing until
the scheduler entry of this process has set `STATE.hooks`. Values, contexts and units are the
builtin runtime's, so `faults/` installs unchanged into either engine.
"""

from __future__ import annotations

import functools
from typing import Any

from hicache_diag.engines.sglang.plugin.dma_points import wrap_layer_wait, wrap_start
from hicache_diag.engines.sglang.plugin.hook_state import STATE, apply_hook, reset
from hicache_diag.engines.sglang.plugin.pool_points import (
    need_execute,
    need_write_backup,
    wrap_backup,
    wrap_evict_host,
    wrap_finish_write_ack,
    wrap_host_alloc,
    wrap_load_back,
)
from hicache_diag.engines.sglang.plugin.post_import import patch_attr, when_imported
from hicache_diag.faults.link_delay import message

# The plugin's face: boot.py arms STATE and calls install_hook_points; tests reset STATE.
__all__ = ["STATE", "install_hook_points", "reset"]


def _wrap_time_counter(original):
    @functools.wraps(original)
    def get_and_increase_time_counter():
        return apply_hook("now", original())

    return get_and_increase_time_counter


def _wrap_batch_exists(original):
    @functools.wraps(original)
    def batch_exists(self, keys, *args, **kwargs):
        found = original(self, keys, *args, **kwargs)
        return apply_hook("storage_exists", found, num_pages=len(keys))

    return batch_exists


def _wrap_file_get(original):
    @functools.wraps(original)
    def get(self, key, *args, **kwargs):
        if not apply_hook("storage_read", True, page_index=None, num_pages=1):
            return None  # what HiCacheFile.get returns for a missing page
        return original(self, key, *args, **kwargs)

    return get


def _wrap_pyobj_send(original):
    @functools.wraps(original)
    def point_to_point_pyobj(data, rank, group=None, src=0, dst=1, *args, **kwargs):
        if rank != src:
            return original(data, rank, group, src, dst, *args, **kwargs)
        with message("reqs"):  # p2p-delay: the link delivers late (faults/link_delay.py)
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
            lag = apply_hook("session_clock", 0.0)
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
            delta = apply_hook("flush_clock", 0.0, timeout_s=timeout_s)
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


_CC = "sglang.srt.managers.cache_controller"
_MEM = "sglang.srt.mem_cache."
_TREES = (
    (_MEM + "unified_radix_cache", "UnifiedRadixCache"),
    (_MEM + "hiradix_cache", "HiRadixCache"),
)
_TREE_POINTS = (
    ("evict_host", wrap_evict_host),
    ("load_back", wrap_load_back),
    ("_pp_sync", _wrap_pp_sync),
    ("_finish_write_through_ack", wrap_finish_write_ack),
)


def _points() -> list[tuple[str, str | None, str, Any]]:
    """(module, owner or None for a module function, name, wrapper maker) of every hook point,
    in install order; targets.py names the same symbols for the scan before launch."""
    clock = (_MEM + "unified_cache.components.base", None, "get_and_increase_time_counter")
    return [
        (_CC, "HiCacheController", "start_writing", wrap_start("write", "ack_write_queue")),
        (_CC, "HiCacheController", "start_loading", wrap_start("load", "ack_load_queue")),
        (_CC, "LayerLoadingEvent", "wait", wrap_layer_wait),
        (_MEM + "pool_host.base", "HostKVCache", "alloc", wrap_host_alloc),
        (_MEM + "memory_pool_host", "HostKVCache", "alloc", wrap_host_alloc),
        (*clock, _wrap_time_counter),
        *((module, tree, name, make) for module, tree in _TREES for name, make in _TREE_POINTS),
        (*_TREES[0], "_execute_kv_backup", wrap_backup(need_execute)),
        (*_TREES[1], "write_backup", wrap_backup(need_write_backup)),
        (_MEM + "hicache_storage", "HiCacheStorage", "batch_exists", _wrap_batch_exists),
        (_MEM + "hicache_storage", "HiCacheFile", "get", _wrap_file_get),
        ("sglang.srt.utils.common", None, "point_to_point_pyobj", _wrap_pyobj_send),
        (
            "sglang.srt.distributed.parallel_state",
            "GroupCoordinator",
            "send_tensor_dict",
            _wrap_tensor_dict_send,
        ),
        (
            "sglang.srt.session.session_controller",
            "SessionController",
            "maybe_reap",
            _wrap_maybe_reap,
        ),
        (
            "sglang.srt.managers.scheduler_components.flush_wrapper",
            "SchedulerFlushWrapper",
            "handle",
            _wrap_flush_handle,
        ),
    ]


def install_hook_points() -> None:
    for module, owner, name, make in _points():
        _on(module, owner, name, make)
