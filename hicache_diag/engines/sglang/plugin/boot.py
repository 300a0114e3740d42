"""What the plugin does in each process of one SGLang launch: shims and hook points everywhere;
per rank, in the scheduler entry, the Hooks table, the faults and the recorder.

A production recording (`hicache-diag record`: PluginConfig.production) arms the same recorder
with no faults and no CPU shims unless asked for, guards every patch (post_import.py) so that
nothing the plugin does can reach SGLang, and adds the rank's dumps (dumps.py) on SGLang's
watchdog, on an exception leaving the event loop, on the checker's mismatch, when triage asks
and on the operator's signal."""

from __future__ import annotations

import functools
import inspect
import logging
import os
import sys
import time

from hicache_diag.engines.sglang.plugin import consensus_block, dumps, hook_points, source_probes
from hicache_diag.engines.sglang.plugin.config import PluginConfig
from hicache_diag.engines.sglang.plugin.hook_points import STATE
from hicache_diag.engines.sglang.plugin.post_import import guard_patches, patch_attr, when_imported
from hicache_diag.engines.sglang.plugin.recorder import StepRecorder, jsonl_path

logger = logging.getLogger("hicache_diag.engines.sglang.plugin")

SCHEDULER = "sglang.srt.managers.scheduler"
WATCHDOG = "sglang.srt.utils.watchdog"  # WatchdogRaw, 0.5.12-0.5.23 (targets.py)
TREE_MODULES = (
    ("sglang.srt.mem_cache.unified_radix_cache", "UnifiedRadixCache"),
    ("sglang.srt.mem_cache.hiradix_cache", "HiRadixCache"),
)

_config: PluginConfig | None = None


def boot() -> None:
    global _config
    _config = PluginConfig.from_env()
    if _config is None:
        return
    if _config.cpu_shims:
        from hicache_diag.engines.sglang.plugin.shims import install_cpu_shims

        install_cpu_shims(_config.cpu_kernel_names or _scanned_kernel_names())
    if _config.production:
        if not _config.record:  # HICACHE_DIAG_RECORD=off: SGLang exactly as it is
            return
        from hicache_diag.engines.sglang.plugin.production import OFF

        guard_patches(OFF)
        when_imported(WATCHDOG, _patch_watchdog)
    hook_points.install_hook_points()
    source_probes.install_source_probes()
    when_imported(SCHEDULER, _patch_scheduler)
    for module, cls in TREE_MODULES:
        when_imported(module, functools.partial(_patch_tree, cls=cls))


# -- the scheduler process -------------------------------------------------------------------
def _arm_rank(server_args, tp_rank: int, pp_rank: int) -> None:
    from hicache_diag.faults.hooks import Hooks
    from hicache_diag.faults.install import install_faults

    assert _config is not None
    tp_size = int(getattr(server_args, "tp_size", 1) or 1)
    rank = pp_rank * tp_size + tp_rank
    hooks = Hooks(rank=rank, pp_rank=pp_rank, tp_rank=tp_rank)
    if _config.faults:
        install_faults(
            hooks, _config.faults, _config.seed, rank=rank, pp_rank=pp_rank, tp_rank=tp_rank
        )
    STATE.hooks = hooks
    if hooks.has("p2p_send"):  # p2p-delay: this rank's outgoing link delivers late
        import torch.distributed

        from hicache_diag.faults import link_delay

        link_delay.install(hooks, torch.distributed)
    if _config.record and _config.session_dir is not None:
        from hicache_diag.engines.sglang.plugin.production import arm_rank

        arm_rank(_config.session_dir, hooks, server_args, (rank, pp_rank, tp_rank))
    elif _config.record:
        path = jsonl_path(_config.run_dir, rank)
        STATE.recorder = StepRecorder(path, rank, pp_rank, tp_rank, hooks)
    if STATE.recorder is not None:
        depth = int(getattr(server_args, "pp_async_batch_depth", 0) or 0)
        STATE.recorder.pp_loop_size = int(getattr(server_args, "pp_size", 1) or 1) + depth
    if consensus_block.checker_enabled():  # --sglang-consensus-checker (production: a dump)
        consensus_block.install(_config.run_dir or None, rank, pp_rank, tp_rank, STATE)
    if _config.control_dir:
        from hicache_diag.engines.sglang.plugin.clean_state import Boundary

        STATE.boundary = Boundary(_config.control_dir, rank)
    os.environ["HICACHE_DIAG_RANK"] = str(rank)


def _wrap_entry(original):
    # By name: 0.5.1x passes attn_cp/moe_dp/moe_ep ranks between tp_rank and pp_rank.
    signature = inspect.signature(original)

    @functools.wraps(original)
    def run_scheduler_process(*args, **kw):
        bound = signature.bind_partial(*args, **kw).arguments
        _arm_rank(bound["server_args"], int(bound["tp_rank"]), int(bound["pp_rank"]))
        return original(*args, **kw)

    return run_scheduler_process


def _wrap_step(original):
    @functools.wraps(original)
    def get_next_batch_to_run(self, *args, **kwargs):
        recorder, hooks = STATE.recorder, STATE.hooks
        STATE.scheduler = self
        if recorder is not None:
            recorder.begin_step()
        if hooks is not None:
            _hold_host(self, hooks, recorder)
            stall = hooks.apply("scheduler_step", 0.0)
            if stall > 0:
                time.sleep(stall)
        try:
            plan = original(self, *args, **kwargs)
        except BaseException as exc:
            if recorder is not None:
                recorder.write_crash(exc)
            raise
        if recorder is not None:
            recorder.end_step(self, getattr(plan, "batch_to_run", plan))
        if STATE.boundary is not None:  # a warm server: the harness may ask for a proof
            STATE.boundary.poll(self, recorder)
        return plan

    return get_next_batch_to_run


def _hold_host(scheduler, hooks, recorder) -> None:
    """The host-shortage side pool, settled at the top of the step (scheduler thread)."""
    if not hooks.has("host_hold"):
        return
    from hicache_diag.faults.side_pool import SidePool

    if STATE.side_pool is None:
        STATE.side_pool = SidePool()
    tree = getattr(scheduler, "tree_cache", None)
    pool = getattr(getattr(tree, "cache_controller", None), "mem_pool_host", None)
    held = STATE.side_pool.hold(hooks, pool)
    if recorder is not None:
        recorder.host_held = held


# The loops a scheduler runs its steps in (PP, plain, overlap): what raises in a forward, after
# get_next_batch_to_run returned (form A's reshape), leaves them, not the step wrapper.
EVENT_LOOPS = ("event_loop_pp", "event_loop_normal", "event_loop_overlap")


def _wrap_loop(original):
    @functools.wraps(original)
    def event_loop(self, *args, **kwargs):
        try:
            return original(self, *args, **kwargs)
        except BaseException as exc:
            if STATE.recorder is not None:
                STATE.recorder.write_crash(exc)  # once: the step wrapper may have written it
                dumps.fire("exception", {"error": f"{type(exc).__name__}: {exc}"})
            raise

    return event_loop


def _patch_watchdog(module) -> None:
    """SGLang's watchdog thread calls pyspy_dump_schedulers() the moment it fires (the scheduler's
    hard and soft watchdogs alike), before it logs the timeout and SIGQUITs the launcher."""
    if hasattr(module, "pyspy_dump_schedulers"):
        patch_attr(module, "pyspy_dump_schedulers", _wrap_watchdog_dump)


def _wrap_watchdog_dump(original):
    @functools.wraps(original)
    def pyspy_dump_schedulers(*args, **kwargs):
        dumps.fire("watchdog", _watchdog_detail())
        return original(*args, **kwargs)

    return pyspy_dump_schedulers


def _watchdog_detail() -> dict:
    """Which watchdog fired: the WatchdogRaw whose `_watchdog_once` called us (its own fields)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_name != "_watchdog_once":
        frame = frame.f_back
    raw = frame.f_locals.get("self") if frame is not None else None
    return {
        "watchdog": getattr(raw, "debug_name", None),
        "soft": getattr(raw, "soft", None),
        "timeout_s": getattr(raw, "watchdog_timeout", None),
    }


def _scanned_kernel_names() -> dict[str, list[str]]:
    """A recorded server's CPU shims (asked for; no harness scanned the release): the names
    this release's own source imports from sgl_kernel on CPU."""
    import importlib.util
    from pathlib import Path

    from hicache_diag.engines.sglang.plugin.cpu_kernels import scan_cpu_kernel_names

    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return {}
    return scan_cpu_kernel_names(Path(next(iter(spec.submodule_search_locations))))


def _patch_scheduler(module) -> None:
    patch_attr(module, "run_scheduler_process", _wrap_entry)
    patch_attr(module.Scheduler, "get_next_batch_to_run", _wrap_step)
    for name in EVENT_LOOPS:
        if hasattr(module.Scheduler, name):  # SchedulerPPMixin's, bound on Scheduler itself
            patch_attr(module.Scheduler, name, _wrap_loop)


# -- the tree: what each rank consumed, synced and evicted -------------------------------------
def _wrap_check(kind: str):
    queue_name = f"ack_{kind}_queue"

    def make(original):
        @functools.wraps(original)
        def check(self, *args, **kwargs):
            finish_count = kwargs.get("finish_count")
            if finish_count is not None:  # 0.5.2x: the count synced once per step is passed in
                result = original(self, *args, **kwargs)
                if STATE.recorder is not None and finish_count:
                    STATE.recorder.consumed(kind, finish_count)
                    STATE.recorder.source_decided(f"dma-ack-count.{kind}", int(finish_count))
                return result
            # Older releases count and sync inside the check: what it drained is what it popped
            # (only the scheduler thread appends to these queues).
            queue = getattr(getattr(self, "cache_controller", None), queue_name, None)
            before = len(queue) if queue is not None else 0
            result = original(self, *args, **kwargs)
            drained = before - len(queue) if queue is not None else 0
            if STATE.recorder is not None and drained > 0:
                STATE.recorder.consumed(kind, drained)
                STATE.recorder.source_decided(f"dma-ack-count.{kind}", drained)
            return result

        return check

    return make


def _wrap_sync(original):
    @functools.wraps(original)
    def _sync_hicache_ready_counts(self, *args, **kwargs):
        source_probes.read_control_queues(self)  # just before SGLang's own qsize() reads
        result = original(self, *args, **kwargs)
        if STATE.recorder is not None:
            write, load, storage = result[0], result[1], result[2]
            STATE.recorder.synced("ready_counts", [write, load, *storage])
        return result

    return _sync_hicache_ready_counts


def _wrap_evict(original):
    @functools.wraps(original)
    def evict(self, *args, **kwargs):  # named after what it wraps: evict or _evict
        result = original(self, *args, **kwargs)
        if STATE.recorder is not None:
            STATE.recorder.count("evicted", getattr(result, "num_tokens_evicted", 0) or 0)
        return result

    return evict


def _wrap_count_ready(original):
    @functools.wraps(original)
    def _count_ready_acks(self, ack_queue, *args, **kwargs):
        n = original(self, ack_queue, *args, **kwargs)
        cc = getattr(self, "cache_controller", None)
        if STATE.recorder is not None and cc is not None:
            kind = "write" if ack_queue is getattr(cc, "ack_write_queue", None) else "load"
            STATE.recorder.counted(kind, n)
            STATE.recorder.source_read(f"dma-ack-count.{kind}", int(n))
        return n

    return _count_ready_acks


def _patch_tree(module, cls: str) -> None:
    tree = getattr(module, cls, None)
    if tree is None:
        return
    patch_attr(tree, "writing_check", _wrap_check("write"))
    patch_attr(tree, "loading_check", _wrap_check("load"))
    if hasattr(tree, "_sync_hicache_ready_counts"):
        patch_attr(tree, "_sync_hicache_ready_counts", _wrap_sync)
    if hasattr(tree, "_count_ready_acks"):
        patch_attr(tree, "_count_ready_acks", _wrap_count_ready)
    # `_evict` is the one place both evict() and evict_for_alloc() go through (0.5.2x).
    core = "_evict" if hasattr(tree, "_evict") else "evict"
    if hasattr(tree, core):
        patch_attr(tree, core, _wrap_evict)
