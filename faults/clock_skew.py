"""clock-skew: the clock one rank's tree stamps `last_access_time` with runs off.

`offset-ms` shifts it, `drift-ppm` makes it run fast or slow from its first reading, and
`jitter-us` adds seeded noise that can reorder two stamps, which is what changes LRU victims
(a constant offset or drift keeps one rank's order; jitter does not).
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
class ClockSkew(Fault):
    NAME: ClassVar[str] = "clock-skew"
    POINTS: ClassVar[tuple[str, ...]] = ("now",)
    SUMMARY: ClassVar[str] = "the clock one rank's tree stamps last_access_time with"
    EFFECT_KEYS: ClassVar[tuple[str, ...]] = ("offset-ms", "drift-ppm", "jitter-us")
    EVENT: ClassVar[str] = (
        "the clock one rank's LRU stamps come from runs off (an NTP step, a VM's clock drift)"
    )
    WHEN: ClassVar[str] = (
        "only where a release stamps LRU from a wall or monotonic clock per rank; 0.5.2x's "
        "unified tree stamps a logical counter instead"
    )
    ACTS_IN: ClassVar[tuple[tuple[str, str], ...]] = (
        (
            "0.5.18+",
            "unified_cache/components/base.get_and_increase_time_counter (a logical "
            "counter stepping 1.0; refused on the Rust tree core, which never calls it)",
        ),
        ("0.5.12-0.5.14", "not hooked: HiRadixCache stamps time.monotonic() inline"),
        ("builtin", "the LRU stamp of evict_policy under --switch lru-clock=monotonic"),
    )
    CANNOT: ClassVar[str] = (
        "the clocks SGLang still reads per rank: session_controller.maybe_reap and the flush "
        "deadline of SchedulerFlushWrapper (the session-clock and flush-clock faults)"
    )
    UNREACHABLE: ClassVar[str] = (
        "on 0.5.18+ it adds seconds to a logical counter that steps by 1.0 per access and is "
        "never skewed by rank in SGLang"
    )

    offset_ms: float = K.key(
        0.0, K.offset_millis, "constant offset in milliseconds (may be negative)"
    )
    drift_ppm: float = K.key(0.0, K.ppm, "rate error in parts per million since first reading")
    jitter_us: float = K.key(0.0, K.micros, "seeded uniform noise of +-jitter-us microseconds")

    def skew(self, value: float, origin: float, noise_us: float) -> float:
        """Seconds to add to a reading `value`, given the first reading `origin`."""
        return self.offset_ms / 1e3 + self.drift_ppm * 1e-6 * (value - origin) + noise_us / 1e6

    def install(self, hooks: Hooks, schedule: Schedule) -> None:
        state: dict[str, Any] = {"origin": None, "recorded_step": None}

        def on_now(value: float, ctx: dict[str, Any]) -> float:
            if state["origin"] is None:
                state["origin"] = value
            if not schedule.fires(ctx["step"]):
                return value
            noise = schedule.uniform(-self.jitter_us, self.jitter_us)
            delta = self.skew(value, state["origin"], noise)
            # The clock is read many times per step; one record per step keeps the jsonl small.
            if state["recorded_step"] != ctx["step"]:
                state["recorded_step"] = ctx["step"]
                hooks.record(self.NAME, skew_ms=round(delta * 1e3, 6))
            return value + delta

        hooks.register("now", on_now)
