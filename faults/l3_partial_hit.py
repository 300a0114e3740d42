"""l3-partial-hit: one rank's L3 storage finds fewer leading pages, loses page reads, or is slow.

`keep` shortens what `batch_exists` reports (the L3 hit-length divergence of #27010), `holes`
fails single page reads (completed-tokens / progress divergence), `slow-ms` delays each read.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from hicache_diag.faults import keys as K
from hicache_diag.faults.base import Fault

if TYPE_CHECKING:
    from hicache_diag.faults.hooks import Hooks
    from hicache_diag.faults.schedule import Schedule


@dataclass(frozen=True, slots=True)
class L3PartialHit(Fault):
    NAME: ClassVar[str] = "l3-partial-hit"
    POINTS: ClassVar[tuple[str, ...]] = ("storage_exists", "storage_read")
    SUMMARY: ClassVar[str] = "one rank's storage batch_exists / page reads"
    EFFECT_KEYS: ClassVar[tuple[str, ...]] = ("keep", "holes", "slow-ms")
    EVENT: ClassVar[str] = (
        "one rank's L3 store answers differently: a shared file system whose listing lags on "
        "one node (keep), a page read that fails (holes), a slow storage node (slow-ms)"
    )
    WHEN: ClassVar[str] = (
        "NFS/Lustre metadata caches, pages written by a peer not yet visible, storage outages"
    )
    ACTS_IN: ClassVar[tuple[tuple[str, str], ...]] = (
        ("0.5.12+", "HiCacheStorage.batch_exists (keep) and HiCacheFile.get (holes, slow-ms)"),
        ("builtin", "HiCacheFile batch_exists and page reads"),
    )
    CANNOT: ClassVar[str] = (
        "backends other than file; a corrupt page (a read succeeds or returns nothing)"
    )

    keep: float = K.key(1.0, K.probability, "fraction of the found leading pages reported")
    holes: float = K.key(0.0, K.probability, "probability that one page read fails")
    slow_ms: float = K.key(0.0, K.millis, "milliseconds each page read takes extra")

    def kept_pages(self, found: int) -> int:
        return min(found, math.floor(found * self.keep))

    def install(self, hooks: Hooks, schedule: Schedule) -> None:
        # Lookups (prefetch thread) and reads (IO thread) race; separate streams keep each
        # point's draws in its own opportunity order.
        exists_schedule, read_schedule = schedule.fork("exists"), schedule.fork("read")

        def on_storage_exists(found: int, ctx: dict[str, Any]) -> int:
            if self.keep >= 1.0 or not found or not exists_schedule.fires(ctx["step"]):
                return found
            kept = self.kept_pages(found)
            if kept < found:
                hooks.record(
                    self.NAME, step=ctx["step"], point="storage_exists", found=found, kept=kept
                )
            return kept

        def on_storage_read(ok: bool, ctx: dict[str, Any]) -> bool:
            if not self.holes and not self.slow_ms:
                return ok
            if not read_schedule.fires(ctx["step"]):
                return ok
            if self.slow_ms:
                time.sleep(self.slow_ms / 1000.0)
            hole = ok and read_schedule.chance(self.holes)
            if hole or self.slow_ms:
                detail = {"page_index": ctx.get("page_index"), "failed": hole, "step": ctx["step"]}
                hooks.record(self.NAME, point="storage_read", slow_ms=self.slow_ms, **detail)
            return ok and not hole

        hooks.register("storage_exists", on_storage_exists)
        hooks.register("storage_read", on_storage_read)
