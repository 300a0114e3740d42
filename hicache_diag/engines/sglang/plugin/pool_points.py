"""The pool hook points: host allocs (`host_alloc`), device slots held during a load-back
(`device_hold`), and what each rank's own host pool did (evictions, skipped backups, finished
write-throughs) for the recorder."""

from __future__ import annotations

import functools
from typing import Any

from hicache_diag.engines.sglang.plugin.hook_state import STATE, apply_hook


def _host_pool(tree: Any) -> Any:
    return getattr(getattr(tree, "cache_controller", None), "mem_pool_host", None)


def wrap_evict_host(original):
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


def wrap_backup(need_of):
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
            tried = (
                recorder.peek("host_evict_calls") > calls
                or recorder.peek("host_alloc_failed") > failed
            )
            # A tensor (the host indices) or None in 0.5.18+; an int (tokens) in 0.5.1x.
            skipped = result is None or (isinstance(result, int) and result == 0 and tried)
            if skipped:
                recorder.shortage(
                    need=need_of(args, kwargs),
                    free=free,
                    evicted=recorder.peek("host_evicted") - evicted,
                    evict_calls=recorder.peek("host_evict_calls") - calls,
                )
            return result

        return backup

    return make


def wrap_finish_write_ack(original):
    """Which node's write-through each rank finished (and unlocked) this step: the ledger."""

    @functools.wraps(original)
    def _finish_write_through_ack(self, ack_id, *args, **kwargs):
        if STATE.recorder is not None:
            STATE.recorder.acked_node(ack_id)
        return original(self, ack_id, *args, **kwargs)

    return _finish_write_through_ack


def wrap_load_back(original):
    """device-alloc-fail: a concurrent consumer holds device slots during this load-back."""

    @functools.wraps(original)
    def load_back(self, *args, **kwargs):
        hooks = STATE.hooks
        allocator = getattr(self, "token_to_kv_pool_allocator", None)
        if hooks is None or allocator is None or not hooks.has("device_hold"):
            return original(self, *args, **kwargs)
        from hicache_diag.faults.side_pool import SidePool

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


def need_execute(args, kwargs) -> int:
    value = args[1] if len(args) > 1 else kwargs.get("device_value")
    return len(value) if value is not None else 0


def need_write_backup(args, kwargs) -> int:
    node = args[0] if args else kwargs.get("node")
    value = getattr(node, "value", None)
    return len(value) if value is not None else 0


def wrap_host_alloc(original):
    @functools.wraps(original)
    def alloc(self, need_size, *args, **kwargs):
        if not apply_hook("host_alloc", True, num_tokens=int(need_size)):
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
