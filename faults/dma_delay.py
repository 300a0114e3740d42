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
    from hicache_diag.faults.hooks import Hooks
    from hicache_diag.faults.schedule import Schedule


@dataclass(frozen=True, slots=True)
class DmaDelay(Fault):
    NAME: ClassVar[str] = "dma-delay"
    POINTS: ClassVar[tuple[str, ...]] = ("dma_complete",)
    SUMMARY: ClassVar[str] = "completion time of one rank's DMA (its events stay not-ready longer)"
    EFFECT_KEYS: ClassVar[tuple[str, ...]] = ("ms", "jitter-ms")
    EVENT: ClassVar[str] = (
        "a device<->host copy that finishes late on one rank: its completion event is late for "
        "the forward's wait and for the ack alike (a PCIe link shared with NCCL or other copies, "
        "a throttled copy engine, NUMA-remote host buffers)"
    )
    WHEN: ClassVar[str] = (
        "PCIe or host-memory contention under heavy decode; large load-backs; one GPU of a node "
        "sharing its link with a NIC"
    )
    ACTS_IN: ClassVar[tuple[tuple[str, str], ...]] = (
        (
            "0.5.18+",
            "HiCacheController.start_writing/start_loading: the completion's finish "
            "event (the ack and set_hicache_transfer_done_event) and, for a load-back, "
            "the producer LayerLoadingEvent's per-layer events that "
            "LayerLoadingEvent.wait (the forward) waits on and "
            "LayerDoneCounter.update_producer asserts on",
        ),
        (
            "0.5.12-0.5.14",
            "HiCacheController.start_writing/start_loading: the ack's finish "
            "event and the producer LayerLoadingEvent's per-layer events",
        ),
        ("builtin", "DmaEngine._run: the op's last layer event (its finish event) completes late"),
    )
    CANNOT: ClassVar[str] = (
        "a copy slow layer by layer (on SGLang every layer event shares one late ready time; "
        "the builtin delays the last layer); on CPU the forward's wait blocks the host thread, "
        "where a GPU stream would wait without blocking it"
    )

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
