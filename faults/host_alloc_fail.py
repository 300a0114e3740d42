"""host-alloc-fail: one rank's host pool `alloc` returns nothing.

Upstream `HostKVCache.alloc` returns None when the free list is short; then `write_backup` skips
the node on that rank only and the host trees drift apart (the #31425 hazard).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from hicache_diag.faults import keys as K
from hicache_diag.faults.base import Fault

if TYPE_CHECKING:
    from hicache_diag.faults.hooks import Hooks
    from hicache_diag.faults.schedule import Schedule


@dataclass(frozen=True, slots=True)
class HostAllocFail(Fault):
    NAME: ClassVar[str] = "host-alloc-fail"
    POINTS: ClassVar[tuple[str, ...]] = ("host_alloc",)
    SUMMARY: ClassVar[str] = "one rank's host pool alloc returns nothing"
    EVENT: ClassVar[str] = (
        "none: the host pool's alloc refuses although it has free slots, and no host eviction runs"
    )
    WHEN: ClassVar[str] = (
        "never as such; kept to replay the committed runs made with it (use host-shortage)"
    )
    ACTS_IN: ClassVar[tuple[tuple[str, str], ...]] = (
        ("0.5.18+", "HostKVCache.alloc (mem_cache/pool_host/base.py)"),
        ("0.5.12-0.5.14", "HostKVCache.alloc (mem_cache/memory_pool_host.py)"),
        ("builtin", "HostKVCache.alloc"),
    )
    CANNOT: ClassVar[str] = "a real shortage: host_free stays high and evict_host does not run"
    UNREACHABLE: ClassVar[str] = (
        "HostKVCache.alloc pops a free list over a buffer pinned at start and fails only when "
        "the request exceeds available_size(); 0.5.18+'s _execute_kv_backup returns before "
        "alloc when available_size() < need and evict_host falls short"
    )

    every: int = K.key(1, K.count, "only every N-th alloc in the window may fail (default 1)")

    def install(self, hooks: Hooks, schedule: Schedule) -> None:
        def on_host_alloc(ok: bool, ctx: dict[str, Any]) -> bool:
            if not ok or not schedule.fires(ctx["step"]):
                return ok  # an alloc that already fails is not ours to record
            hooks.record(self.NAME, step=ctx["step"], num_tokens=ctx.get("num_tokens"))
            return False

        hooks.register("host_alloc", on_host_alloc)
