"""p2p-delay: one rank's PP sends are slow (a slow link), which must not change any decision.

It exists so that triage can be checked not to blame the protocol for a network straggler.
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
class P2pDelay(Fault):
    NAME: ClassVar[str] = "p2p-delay"
    POINTS: ClassVar[tuple[str, ...]] = ("p2p_send",)
    SUMMARY: ClassVar[str] = "one rank's p2p sends (a slow link, not a protocol bug)"
    EFFECT_KEYS: ClassVar[tuple[str, ...]] = ("ms",)
    EVENT: ClassVar[str] = "a slow PP link out of one rank: its messages arrive late"
    WHEN: ClassVar[str] = "a congested or degraded NIC/NVLink between two stages"
    ACTS_IN: ClassVar[tuple[tuple[str, str], ...]] = (
        ("0.5.12+", "point_to_point_pyobj and GroupCoordinator.send_tensor_dict (the sender "
                    "sleeps before the send)"),
        ("builtin", "parallel_state's PP sends"),
    )  # fmt: skip
    CANNOT: ClassVar[str] = (
        "a late delivery of an async send without stalling the sender; HiCache's own relay "
        "(_pp_sync) is not delayed"
    )

    ms: float = K.key(0.0, K.millis, "milliseconds added before each PP send")

    def install(self, hooks: Hooks, schedule: Schedule) -> None:
        def on_p2p_send(value: float, ctx: dict[str, Any]) -> float:
            if not self.ms or not schedule.fires(ctx["step"]):
                return value
            hooks.record(self.NAME, msg=ctx.get("msg"), delay_ms=self.ms)
            return value + self.ms / 1000.0

        hooks.register("p2p_send", on_p2p_send)
