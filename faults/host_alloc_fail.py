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
    from hicache_diag.faults.schedule import Schedule
    from hicache_diag.hooks import Hooks


@dataclass(frozen=True, slots=True)
class HostAllocFail(Fault):
    NAME: ClassVar[str] = "host-alloc-fail"
    POINTS: ClassVar[tuple[str, ...]] = ("host_alloc",)
    SUMMARY: ClassVar[str] = "one rank's host pool alloc returns nothing"

    every: int = K.key(1, K.count, "only every N-th alloc in the window may fail (default 1)")

    def install(self, hooks: Hooks, schedule: Schedule) -> None:
        def on_host_alloc(ok: bool, ctx: dict[str, Any]) -> bool:
            if not ok or not schedule.fires(ctx["step"]):
                return ok  # an alloc that already fails is not ours to record
            hooks.record(self.NAME, step=ctx["step"], num_tokens=ctx.get("num_tokens"))
            return False

        hooks.register("host_alloc", on_host_alloc)
