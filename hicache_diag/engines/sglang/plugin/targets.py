"""Every SGLang symbol the plugin touches, named once: a new SGLang release is checked here.

`scan_targets` reads the installed source with `ast` (no import, a second or so) so that the
harness can refuse a release whose targets are gone before it launches anything. A target with
alternatives is satisfied by any one of them (older releases used other homes for a name).
A missing `hook:<point>` target does not refuse the release: only a fault that needs that point
is refused (`missing_points`); a missing probe or shim target refuses it. A missing `dump`
target (a recorded server's dump trigger) refuses nothing: that dump is simply never taken.
A module-level name an SGLang module imports counts as that module's (it is patched there).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Target:
    key: str  # our name for it
    role: str  # shim | hook:<point> | probe | dump
    options: tuple[tuple[str, str], ...]  # (module, qualname) alternatives
    why: str
    until: str | None = None  # the last release that has it: later ones removed it by design


TARGETS: tuple[Target, ...] = (
    # The scheduler process entry: where a rank learns its PP/TP and the plugin arms itself.
    Target(
        "scheduler_entry",
        "probe",
        (("sglang.srt.managers.scheduler", "run_scheduler_process"),),
        "per-rank set-up of hooks, faults and the recorder",
    ),
    Target(
        "scheduler_step",
        "hook:scheduler_step",
        (("sglang.srt.managers.scheduler", "Scheduler.get_next_batch_to_run"),),
        "one call per micro-batch slot of event_loop_pp: the recorder's step",
    ),
    Target(
        "event_loop",
        "probe",
        (
            ("sglang.srt.managers.scheduler_pp_mixin", "SchedulerPPMixin.event_loop_pp"),
            ("sglang.srt.managers.scheduler", "Scheduler.event_loop_normal"),
        ),
        "the step a scheduler died in, wherever in the step it raised (its forward too)",
    ),
    # A recorded server's dump when SGLang's own watchdog fires (the scheduler's hard and soft
    # watchdogs: WatchdogRaw._watchdog_once calls it first, then logs and SIGQUITs).
    Target(
        "watchdog_fired",
        "dump",
        (("sglang.srt.utils.watchdog", "pyspy_dump_schedulers"),),
        "the rank's in-process dump the moment its watchdog fires",
    ),
    Target(
        "writing_check",
        "probe",
        (
            ("sglang.srt.mem_cache.unified_radix_cache", "UnifiedRadixCache.writing_check"),
            ("sglang.srt.mem_cache.hiradix_cache", "HiRadixCache.writing_check"),
        ),
        "write acks consumed per step",
    ),
    Target(
        "loading_check",
        "probe",
        (
            ("sglang.srt.mem_cache.unified_radix_cache", "UnifiedRadixCache.loading_check"),
            ("sglang.srt.mem_cache.hiradix_cache", "HiRadixCache.loading_check"),
        ),
        "load acks consumed per step",
    ),
    Target(
        "start_writing",
        "hook:dma_complete",
        (("sglang.srt.managers.cache_controller", "HiCacheController.start_writing"),),
        "device->host copies: their finish events",
    ),
    Target(
        "start_loading",
        "hook:dma_complete",
        (("sglang.srt.managers.cache_controller", "HiCacheController.start_loading"),),
        "host->device copies: their finish events",
    ),
    Target(
        "layer_wait",
        "hook:dma_complete",
        (("sglang.srt.managers.cache_controller", "LayerLoadingEvent.wait"),),
        "the forward's per-layer wait on a load-back's copy",
    ),
    Target(
        "host_backup",
        "hook:host_hold",
        (
            ("sglang.srt.mem_cache.unified_radix_cache", "UnifiedRadixCache._execute_kv_backup"),
            ("sglang.srt.mem_cache.hiradix_cache", "HiRadixCache.write_backup"),
        ),
        "the write-through backup's host shortage branch",
    ),
    Target(
        "evict_host",
        "hook:host_hold",
        (
            ("sglang.srt.mem_cache.unified_radix_cache", "UnifiedRadixCache.evict_host"),
            ("sglang.srt.mem_cache.hiradix_cache", "HiRadixCache.evict_host"),
        ),
        "host evictions that make room for a backup",
    ),
    Target(
        "load_back",
        "hook:device_hold",
        (
            ("sglang.srt.mem_cache.unified_radix_cache", "UnifiedRadixCache.load_back"),
            ("sglang.srt.mem_cache.hiradix_cache", "HiRadixCache.load_back"),
        ),
        "the load-back whose device allocation a concurrent consumer can make short",
    ),
    Target(
        "host_alloc",
        "hook:host_alloc",
        (
            ("sglang.srt.mem_cache.pool_host.base", "HostKVCache.alloc"),
            ("sglang.srt.mem_cache.memory_pool_host", "HostKVCache.alloc"),
        ),
        "the host pool's alloc",
    ),
    Target(
        "time_counter",
        "hook:now",
        (("sglang.srt.mem_cache.unified_cache.components.base", "get_and_increase_time_counter"),),
        # Before the unified tree became the default (0.5.1x: HiRadixCache, opt-in
        # SGLANG_ENABLE_UNIFIED_RADIX_TREE), the live tree stamps time.monotonic() inline.
        "the clock the unified tree stamps last_access_time with",
    ),
    Target(
        "storage_exists",
        "hook:storage_exists",
        (("sglang.srt.mem_cache.hicache_storage", "HiCacheStorage.batch_exists"),),
        "L3 hit length: leading pages found",
    ),
    Target(
        "storage_read",
        "hook:storage_read",
        (("sglang.srt.mem_cache.hicache_storage", "HiCacheFile.get"),),
        "one L3 page read",
    ),
    Target(
        "pp_send_pyobj",
        "hook:p2p_send",
        (("sglang.srt.utils.common", "point_to_point_pyobj"),),
        "PP sends of request lists",
    ),
    Target(
        "pp_send_tensor_dict",
        "hook:p2p_send",
        (("sglang.srt.distributed.parallel_state", "GroupCoordinator.send_tensor_dict"),),
        "PP sends of proxy and output tensors",
    ),
    # 0.5.1x-0.5.23: every rank reaps sessions on its own 1 s tick (process_input_requests).
    Target(
        "session_reap",
        "hook:session_clock",
        (("sglang.srt.session.session_controller", "SessionController.maybe_reap"),),
        "deferred session closes and session timeouts, on this rank's reap tick",
    ),
    # 0.5.13-0.5.23: /flush_cache?timeout= waits for idle until a per-rank deadline.
    Target(
        "flush_deadline",
        "hook:flush_clock",
        (
            (
                "sglang.srt.managers.scheduler_components.flush_wrapper",
                "SchedulerFlushWrapper.handle",
            ),
        ),
        "the deferred flush's per-rank deadline",
    ),
    # The dynamic source probes (source_probes.py, docs/sources.md "Dynamic"): a release
    # without one leaves that probe unarmed; no fault needs the point.
    Target(
        "source_l3_queues",
        "hook:sources",
        (
            (
                "sglang.srt.mem_cache.unified_radix_cache",
                "UnifiedRadixCache.drain_storage_control_queues",
            ),
            ("sglang.srt.mem_cache.hiradix_cache", "HiRadixCache.drain_storage_control_queues"),
        ),
        "l3-control-queues: the rank's own L3 control-queue sizes at the drain",
    ),
    Target(
        "source_l3_drain",
        "hook:sources",
        (
            (
                "sglang.srt.mem_cache.unified_radix_cache",
                "UnifiedRadixCache._drain_storage_control_queues_impl",
            ),
            (
                "sglang.srt.mem_cache.hiradix_cache",
                "HiRadixCache._drain_storage_control_queues_impl",
            ),
        ),
        "l3-control-queues: the counts drained",
    ),
    Target(
        "source_ack_count",
        "hook:sources",
        (
            ("sglang.srt.mem_cache.unified_radix_cache", "UnifiedRadixCache._count_ready_acks"),
            ("sglang.srt.mem_cache.hiradix_cache", "HiRadixCache._count_ready_acks"),
        ),
        "dma-ack-count: the ready-ack count a rank read",
    ),
    Target(
        "source_flush_deadline",
        "hook:sources",
        (
            (
                "sglang.srt.managers.scheduler_components.flush_wrapper",
                "SchedulerFlushWrapper.check_pending",
            ),
        ),
        "flush-deadline: time left to the rank's deadline, and how the flush ended",
    ),
    # 0.5.1x-0.5.19: each rank drops timed-out waiting requests on its own clock (0.5.20 moved
    # the decision to PP0 TP0, `_poll_timeout_aborts`, relayed: nothing per rank to probe).
    Target(
        "source_waiting_clock",
        "hook:sources",
        (("sglang.srt.managers.scheduler", "Scheduler._abort_on_waiting_timeout"),),
        "waiting-clock: the oldest waiting request's age and the rids the rank dropped",
        until="0.5.19",
    ),
    # CPU shims (reference/sglang-on-cpu.md): where SGLang assumes CUDA.
    Target(
        "assign_req_to_token_pool",
        "shim",
        (
            ("sglang.srt.mem_cache.allocation", "assign_req_to_token_pool_func"),
            # 0.5.1x: only speculative decoding assigns through it (a triton kernel); the
            # serving path writes req_to_token in plain torch, so nothing needs the CPU kernel.
            ("sglang.srt.speculative.triton_ops.cache_locs", "assign_req_to_token_pool_func"),
            ("sglang.srt.speculative.spec_utils", "assign_req_to_token_pool_func"),
        ),
        "calls sgl_kernel.assign_req_to_token_pool_cpu on CPU",
    ),
    Target(
        "host_pin_memory",
        "shim",
        (
            ("sglang.srt.mem_cache.pool_host.base", "HostKVCache.__init__"),
            ("sglang.srt.mem_cache.memory_pool_host", "HostKVCache.__init__"),
        ),
        "pin_memory=True: cudaHostRegister and pinned L3 bounce pages",
    ),
    Target(
        "transfer_kv_direct",
        "shim",
        (
            ("sglang.srt.mem_cache.pool_host.mha", "MHATokenToKVPoolHost"),
            ("sglang.srt.mem_cache.memory_pool_host", "MHATokenToKVPoolHost"),
        ),
        "imports transfer_kv_* only on CUDA/HIP",
    ),
)


def _defined(tree: ast.Module, qualname: str) -> bool:
    body: list[ast.stmt] = tree.body
    for part in qualname.split("."):
        found = None
        for node in _walk_defs(body):
            if getattr(node, "name", None) == part:
                found = node
                break
        if found is None:
            return False
        body = getattr(found, "body", [])
    return True


def _walk_defs(body: list[ast.stmt]):
    """Top-level defs, including those under module-level if/try (platform branches), and the
    names a module imports (each as an alias node: its `name` is the name bound)."""
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            yield node
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                yield ast.alias(name=alias.asname or alias.name)
        elif isinstance(node, ast.If | ast.Try):
            yield from _walk_defs(node.body + node.orelse)
            for handler in getattr(node, "handlers", []):
                yield from _walk_defs(handler.body)


def module_file(root: Path, module: str) -> Path | None:
    rel = Path(*module.split("."))
    for candidate in (root / rel.with_suffix(".py"), root / rel / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def scan_targets(site_root: Path, *, roles: str = "all") -> list[str]:
    """Targets missing from the SGLang whose package dir's parent is `site_root`; [] = all there.
    `roles="required"` skips hook targets (a release may lack a point); `"hooks"`: only those."""
    missing = missing_targets(site_root, roles)
    return [" or ".join(f"{m}.{q}" for m, q in t.options) for t in missing]


def missing_points(site_root: Path) -> dict[str, str]:
    """Hook point -> the target it lacks in this release (faults on that point are refused)."""
    return {
        t.role.split(":", 1)[1]: " or ".join(f"{m}.{q}" for m, q in t.options)
        for t in missing_targets(site_root, "hooks")
    }


def missing_targets(site_root: Path, roles: str = "all") -> list[Target]:
    parsed: dict[str, ast.Module | None] = {}
    missing = []
    for target in TARGETS:
        is_hook = target.role.startswith("hook:")
        optional = is_hook or target.role == "dump"
        if (roles == "required" and optional) or (roles == "hooks" and not is_hook):
            continue
        ok = False
        for module, qualname in target.options:
            if module not in parsed:
                path = module_file(site_root, module)
                parsed[module] = ast.parse(path.read_text()) if path else None
            tree = parsed[module]
            if tree is not None and _defined(tree, qualname):
                ok = True
                break
        if not ok:
            missing.append(target)
    return missing
