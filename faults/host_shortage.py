"""host-shortage: one stage's usable host KV pool is smaller than its peers' (a side pool holds
host slots there), so SGLang's own shortage path decides that stage's backups.

The engine holds the slots through the pool's own alloc/free (faults/side_pool.py); the
backup path then reads a lower `available_size()`, calls `evict_host`, and skips the backup when
eviction falls short (`_execute_kv_backup` in 0.5.18+, `write_backup`'s retry before), on this
stage alone: followers still apply PP0's relayed ack count (the #31425 hazard).
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
class HostShortage(Fault):
    NAME: ClassVar[str] = "host-shortage"
    POINTS: ClassVar[tuple[str, ...]] = ("host_hold",)
    SUMMARY: ClassVar[str] = "one stage's host KV pool shrinks: a side pool holds its slots"
    EFFECT_KEYS: ClassVar[tuple[str, ...]] = ("hold", "leave")
    EVENT: ClassVar[str] = (
        "host memory taken from one stage's KV pool by state HiCache does not own: a hybrid "
        "SWA/Mamba/MTP host sidecar that grows on that stage, or another tenant's pinned pages"
    )
    WHEN: ClassVar[str] = (
        "hybrid models whose per-stage layer split gives stages different sidecars; long runs "
        "where the host pool fills and one stage's is fuller (capacity is MIN-synced only at "
        "start, #29258)"
    )
    ACTS_IN: ClassVar[tuple[tuple[str, str], ...]] = (
        (
            "0.5.18+",
            "UnifiedRadixCache._execute_kv_backup (available_size < need -> evict_host "
            "-> return None)",
        ),
        (
            "0.5.12-0.5.14",
            "HiRadixCache.write_backup (cache_controller.write -> None -> evict_host -> retry)",
        ),
        ("builtin", "HiRadixCache.write_backup (write -> evict_host -> retry)"),
    )
    CANNOT: ClassVar[str] = (
        "a sidecar's own transfers or its eviction policy; the held slots are plain KV slots, "
        "so a release that budgets sidecars apart (shared_allocation_domain) is not modelled"
    )

    hold: int = K.key(0, K.tokens, "host tokens the side pool holds from `after` on")
    leave: int | None = K.key(
        None, K.tokens, "or: grow the side pool each step until only this many tokens stay free"
    )

    def install(self, hooks: Hooks, schedule: Schedule) -> None:
        def on_host_hold(held: int, ctx: dict[str, Any]) -> int:
            if not schedule.in_window(ctx["step"]):
                return 0  # outside the window the side pool gives its slots back
            target = self.hold
            if self.leave is not None:
                target = max(target, int(ctx.get("held", 0)) + int(ctx["free"]) - self.leave)
            if target > held:
                hooks.record(self.NAME, held=held, target=target, free=ctx["free"])
            return target

        hooks.register("host_hold", on_host_hold)
