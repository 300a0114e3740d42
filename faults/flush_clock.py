"""flush-clock: one rank's deadline for a deferred `/flush_cache?timeout=T` falls later (earlier).

SGLang 0.5.23's `SchedulerFlushWrapper.handle` defers a flush that finds the rank busy and
stamps a per-rank deadline `time.monotonic() + T`; `check_pending`, once per loop iteration,
flushes when that rank is fully idle and gives up at its own deadline. Each rank stamps the
deadline when the request reaches it: a later stage receives it a relay later, and a rank busy
in a long step reads it a step later. `offset-ms` adds that lateness to this rank's deadline
(negative: the rank stamped it earlier); a few steps' worth is what SGLang reaches by itself,
more stands for a rank that was stalled when the request arrived (docs/faults.md).
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
class FlushClock(Fault):
    NAME: ClassVar[str] = "flush-clock"
    POINTS: ClassVar[tuple[str, ...]] = ("flush_clock",)
    SUMMARY: ClassVar[str] = "when one rank stamps its deferred /flush_cache?timeout= deadline"
    EFFECT_KEYS: ClassVar[tuple[str, ...]] = ("offset-ms",)
    EVENT: ClassVar[str] = (
        "one rank stamps its deferred /flush_cache?timeout= deadline later (or earlier) than "
        "its peers: a later stage gets the request a relay later, a busy or stalled rank "
        "reads its clock a step later"
    )
    WHEN: ClassVar[str] = (
        "every deferred flush on a PP/TP server: each rank keeps its own monotonic deadline "
        "and tests it each iteration"
    )
    ACTS_IN: ClassVar[tuple[tuple[str, str], ...]] = (
        (
            "0.5.13-0.5.23",
            "SchedulerFlushWrapper.handle (managers/scheduler_components/flush_wrapper.py)",
        ),
        ("0.5.12.post1", "refused: no deferred flush"),
    )
    CANNOT: ClassVar[str] = (
        "the idle test itself (is_fully_idle, per rank); offsets beyond a stall's length are "
        "not a natural event"
    )
    BUILTIN_REFUSAL: ClassVar[str] = (
        "the builtin runtime has no /flush_cache and no deferred flush deadline "
        "(use --engine sglang with a release that has SchedulerFlushWrapper)"
    )

    offset_ms: float = K.key(
        0.0, K.offset_millis, "milliseconds added to this rank's flush deadline"
    )

    def install(self, hooks: Hooks, schedule: Schedule) -> None:
        def on_flush_clock(value: float, ctx: dict[str, Any]) -> float:
            if not self.offset_ms or not schedule.fires(ctx["step"]):
                return value
            hooks.record(self.NAME, offset_ms=self.offset_ms, timeout_s=ctx.get("timeout_s"))
            return value + self.offset_ms / 1e3

        hooks.register("flush_clock", on_flush_clock)
