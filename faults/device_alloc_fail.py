"""device-alloc-fail: at a load-back, one rank's device KV pool is short: a concurrent consumer
holds its free slots for that moment, so SGLang's own load-back path evicts or declines.

The engine takes the slots through the device allocator's own alloc just before the tree's
`load_back` and frees them right after it (faults/side_pool.py): SGLang then reads the
lower `available_size()`, runs `evict_for_alloc`, and declines the load-back when eviction falls
short (0.5.18+'s `_load_back_transfers`), or `HiCacheController.load` returns None (0.5.1x),
on that rank alone, while its peers load the same prefix back.
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
class DeviceAllocFail(Fault):
    NAME: ClassVar[str] = "device-alloc-fail"
    POINTS: ClassVar[tuple[str, ...]] = ("device_hold",)
    SUMMARY: ClassVar[str] = "one rank's device pool is short at a load-back (slots held then)"
    EFFECT_KEYS: ClassVar[tuple[str, ...]] = ("hold", "leave")
    EVENT: ClassVar[str] = (
        "one rank's device KV pool shorter than its peers' at the moment of a load-back: "
        "free slots taken there by something its peers did not do (on TP, rank-local pool "
        "drift, upstream #33442; on PP 0.5.23 only an earlier divergence such as a session "
        "released on one stage: overlap scheduling is refused with PP and the pools are "
        "MIN-sized, docs/sources.md)"
    )
    WHEN: ClassVar[str] = (
        "near-full device pools, where one rank's free count is lower for a step than its "
        "peers' (#33442: TP2, whole pages apart, the same TP rank short each time)"
    )
    ACTS_IN: ClassVar[tuple[tuple[str, str], ...]] = (
        (
            "0.5.18+",
            "UnifiedRadixCache.load_back -> _load_back_transfers (available_size < "
            "kv_tokens -> evict_for_alloc -> decline) -> HiCacheController.load",
        ),
        (
            "0.5.12-0.5.14",
            "HiRadixCache.load_back -> HiCacheController.load "
            "(mem_pool_device_allocator.alloc -> None)",
        ),
        ("builtin", "HiRadixCache.load_back -> HiCacheController.load (evict + retry)"),
    )
    CANNOT: ClassVar[str] = (
        "which consumer took the memory, or one that keeps it past the load-back (the slots "
        "are given back when load_back returns)"
    )

    hold: int = K.key(0, K.tokens, "device tokens held during each load-back in the window")
    leave: int | None = K.key(
        None, K.tokens, "or: hold all but this many free device tokens during each load-back"
    )

    def install(self, hooks: Hooks, schedule: Schedule) -> None:
        def on_device_hold(held: int, ctx: dict[str, Any]) -> int:
            if not schedule.fires(ctx["step"]):
                return held
            target = self.hold
            if self.leave is not None:
                target = max(target, int(ctx["free"]) - self.leave)
            hooks.record(self.NAME, target=target, free=ctx["free"], need=ctx.get("need"))
            return target

        hooks.register("device_hold", on_device_hold)
