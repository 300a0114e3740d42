"""The dynamic half of `hicache-diag sources`: targeted wrappers that record, per scheduler step,
what each rank read of the inventoried sources and what the decision fed by it did
(`hicache_diag/evidence/probes.py` names them; docs/sources.md, "Dynamic").

Targeted wrappers, not `sys.setprofile`: a profile hook on Python 3.11 fires for every call of
the scheduler thread and cannot see a C call's result (`time.monotonic()`), while a wrapper on
the method that receives or reads the value costs one call where the read is. Methods a release
lacks are not wrapped and their probe is not armed (`ARMED`, written on each rank's first line).
Some reads sit in methods the plugin already wraps (`maybe_reap`, `HostKVCache.alloc`,
`_count_ready_acks`, `_sync_hicache_ready_counts`, the ack checks): those wrappers record them.
A probe that fails records the failure (`probe_errors`; in production it turns the rank's
recording off instead) and SGLang's call goes on unchanged.
"""

from __future__ import annotations

import functools
import time
from typing import Any

from hicache_diag.engines.sglang.plugin.hook_points import STATE
from hicache_diag.engines.sglang.plugin.post_import import patch_attr, when_imported
from hicache_diag.evidence.probes import CONTROL_QUEUES

TREES = (
    ("sglang.srt.mem_cache.unified_radix_cache", "UnifiedRadixCache"),
    ("sglang.srt.mem_cache.hiradix_cache", "HiRadixCache"),
)

ARMED: set[str] = set()  # probes whose method this process's release has


def read(name: str, value_of) -> None:
    """Record `value_of()` as a read of `name`; a probe error is counted, never raised."""
    recorder = STATE.recorder
    if recorder is None:
        return
    try:
        recorder.source_read(name, value_of())
    except Exception as exc:  # noqa: BLE001 - a probe must never break SGLang's call
        if recorder.on_failure is not None:  # production: the rank stops recording, said once
            recorder.on_failure(f"probe {name}: {type(exc).__name__}: {exc}")
            return
        recorder.count("probe_errors", 1)
        recorder.source_read(name, f"probe error: {type(exc).__name__}")


def decided(name: str, outcome: Any) -> None:
    if STATE.recorder is not None:
        STATE.recorder.source_decided(name, outcome)


def control_queue_sizes(tree: Any) -> list[int] | None:
    """The rank's own L3 control-queue sizes, as SGLang reads them (`qsize()`); None without
    storage (the queues are made when the storage threads start)."""
    cc = getattr(tree, "cache_controller", None)
    queues = [getattr(cc, name, None) for name in CONTROL_QUEUES]
    if cc is None or any(q is None for q in queues):
        return None
    return [int(q.qsize()) for q in queues]


def read_control_queues(tree: Any) -> None:
    if getattr(tree, "enable_storage", False):
        read("l3-control-queues", lambda: control_queue_sizes(tree))


def _wrap_drain(original):
    @functools.wraps(original)
    def drain_storage_control_queues(self, *args, **kwargs):
        read_control_queues(self)  # just before SGLang's own qsize() reads
        return original(self, *args, **kwargs)

    return drain_storage_control_queues


def _wrap_drain_impl(original):
    @functools.wraps(original)
    def _drain_storage_control_queues_impl(self, *args, **kwargs):
        counts = [kwargs.get(k) for k in ("n_storage_hit", "n_backup", "n_release")]
        if any(isinstance(c, int) and c > 0 for c in counts):
            decided("l3-control-queues", counts)
        return original(self, *args, **kwargs)

    return _drain_storage_control_queues_impl


def _wrap_check_pending(original):
    @functools.wraps(original)
    def check_pending(self, *args, **kwargs):
        pending = getattr(self, "_pending", None)
        if pending is None or STATE.recorder is None:
            return original(self, *args, **kwargs)
        read("flush-deadline", lambda: round(pending[1] - time.monotonic(), 3))
        try:
            idle = bool(self._is_fully_idle())
        except Exception:  # noqa: BLE001 - only names the outcome below
            idle = None
        result = original(self, *args, **kwargs)
        if getattr(self, "_pending", None) is None:
            decided("flush-deadline", "flush" if idle else "timeout")
        return result

    return check_pending


def _past_timeout(scheduler: Any, timeout_s: float) -> float | None:
    """Seconds the oldest waiting request is past `timeout_s` on this rank's perf_counter, as
    `_abort_on_waiting_timeout` compares them (an entry time of 0 is never stamped: skipped)."""
    stamps = [req.time_stats.wait_queue_entry_time for req in scheduler.waiting_queue]
    stamps = [t for t in stamps if t > 0]
    return round(time.perf_counter() - min(stamps) - timeout_s, 3) if stamps else None


def _wrap_waiting_timeout(original):
    """0.5.1x's waiting timeout: each rank drops from its own waiting queue what its own clock
    says is due, so one stage may drop a request the other admits (probe `waiting-clock`)."""
    envs = original.__globals__.get("envs")  # the scheduler module's own SGLang env registry

    @functools.wraps(original)
    def _abort_on_waiting_timeout(self, *args, **kwargs):
        queue = getattr(self, "waiting_queue", None)
        if STATE.recorder is None or not queue:
            return original(self, *args, **kwargs)
        try:
            timeout_s = float(envs.SGLANG_REQ_WAITING_TIMEOUT.get())
        except Exception:  # noqa: BLE001 - a probe must never break SGLang's call
            STATE.recorder.count("probe_errors", 1)
            return original(self, *args, **kwargs)
        if timeout_s <= 0:  # SGLang's own early return: nothing read
            return original(self, *args, **kwargs)
        read("waiting-clock", lambda: _past_timeout(self, timeout_s))
        result = original(self, *args, **kwargs)
        if self.waiting_queue is not queue:  # SGLang rebinds the queue only when it dropped some
            kept = {id(req) for req in self.waiting_queue}
            dropped = [str(req.rid) for req in queue if id(req) not in kept]
            if dropped and STATE.recorder is not None:
                STATE.recorder.count("waiting_timeouts", len(dropped))
                decided("waiting-clock", dropped)
        return result

    return _abort_on_waiting_timeout


def _arm(module: str, owner: str, method: str, probes: tuple[str, ...], make=None) -> None:
    def patch(mod) -> None:
        cls = getattr(mod, owner, None)
        if cls is None or not hasattr(cls, method):
            return
        if make is not None:
            patch_attr(cls, method, make)
        ARMED.update(probes)

    when_imported(module, patch)


def install_source_probes() -> None:
    dma = ("dma-ack-count.write", "dma-ack-count.load")
    for module, tree in TREES:
        _arm(module, tree, "drain_storage_control_queues", ("l3-control-queues",), _wrap_drain)
        _arm(
            module,
            tree,
            "_drain_storage_control_queues_impl",
            ("l3-control-queues",),
            _wrap_drain_impl,
        )
        _arm(module, tree, "_count_ready_acks", dma)  # boot._wrap_count_ready records them
    _arm(
        "sglang.srt.managers.scheduler_components.flush_wrapper",
        "SchedulerFlushWrapper",
        "check_pending",
        ("flush-deadline",),
        _wrap_check_pending,
    )
    _arm(
        "sglang.srt.managers.scheduler",
        "Scheduler",
        "_abort_on_waiting_timeout",
        ("waiting-clock",),
        _wrap_waiting_timeout,
    )
    # Recorded by hook_points' own wrappers of these methods.
    _arm(
        "sglang.srt.session.session_controller",
        "SessionController",
        "maybe_reap",
        ("session-clock",),
    )
    _arm("sglang.srt.mem_cache.pool_host.base", "HostKVCache", "alloc", ("host-alloc",))
    _arm("sglang.srt.mem_cache.memory_pool_host", "HostKVCache", "alloc", ("host-alloc",))
