"""dma-delay: one rank's DMA completions come late, so its ack events stay not-ready longer.

The per-rank quantity this perturbs is the count of ready acks (`_count_ready_acks` upstream):
with `ack-count=local` the slow rank drains fewer acks than its peers (#27285).
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
class DmaDelay(Fault):
    NAME: ClassVar[str] = "dma-delay"
    POINTS: ClassVar[tuple[str, ...]] = ("dma_complete",)
    SUMMARY: ClassVar[str] = "completion time of one rank's DMA (its events stay not-ready longer)"
    EFFECT_KEYS: ClassVar[tuple[str, ...]] = ("ms", "jitter-ms")

    ms: float = K.key(0.0, K.millis, "extra milliseconds before the DMA's finish event is ready")
    jitter_ms: float = K.key(0.0, K.millis, "plus a seeded uniform 0..jitter-ms on top")
    dir: str = K.key("both", K.choice("write", "load", "both"), "which copies: write|load|both")

    def install(self, hooks: Hooks, schedule: Schedule) -> None:
        def on_dma_complete(value: float, ctx: dict[str, Any]) -> float:
            direction = ctx.get("direction")
            if self.dir != "both" and direction != self.dir:
                return value  # not an opportunity: other direction
            if not schedule.fires(ctx["step"]):
                return value
            delay_ms = self.ms + schedule.uniform(0.0, self.jitter_ms)
            hooks.record(
                self.NAME,
                step=ctx["step"],  # the submitting step, not the copy thread's "now"
                direction=direction,
                delay_ms=round(delay_ms, 3),
                num_tokens=ctx.get("num_tokens"),
            )
            return value + delay_ms / 1000.0

        hooks.register("dma_complete", on_dma_complete)
