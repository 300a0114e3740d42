"""p2p-delay: one rank's outgoing PP link delivers late, which must not change any decision.

The engine delays delivery on the link (faults/link_delay.py): an async send returns at
once and arrives `ms` later; `msg=sync` aims at HiCache's own `_pp_sync` relay, the one message
that carries PP0's ack counts. Triage must not blame the protocol for a network straggler.
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
class P2pDelay(Fault):
    NAME: ClassVar[str] = "p2p-delay"
    POINTS: ClassVar[tuple[str, ...]] = ("p2p_send",)
    SUMMARY: ClassVar[str] = "one rank's outgoing PP link delivers late (a slow link)"
    EFFECT_KEYS: ClassVar[tuple[str, ...]] = ("ms",)
    EVENT: ClassVar[str] = (
        "a slow PP link out of one rank: its messages are delivered late (async sends "
        "included); the sender is not stalled"
    )
    WHEN: ClassVar[str] = "a congested or degraded NIC/NVLink between two stages"
    ACTS_IN: ClassVar[tuple[tuple[str, str], ...]] = (
        (
            "0.5.13+",
            "torch.distributed.isend/send inside point_to_point_pyobj (reqs), "
            "GroupCoordinator.send_tensor_dict (proxy, output) and HiCache's "
            "_pp_sync relay (sync)",
        ),
        ("0.5.12.post1", "the same, less `sync` (no _pp_sync: each stage counts its own acks)"),
        ("builtin", "parallel_state's PP sends and its pp_sync relay"),
    )
    CANNOT: ClassVar[str] = (
        "bandwidth (a fixed latency per message, whatever its size), loss or reordering; "
        "the receiving side of a link (target the sending rank)"
    )

    ms: float = K.key(0.0, K.millis, "milliseconds each PP message spends on the link")
    msg: str = K.key(
        "all",
        K.choice("all", "sync", "reqs", "proxy", "output"),
        "which messages: all, or sync (HiCache's _pp_sync relay), reqs, proxy, output",
    )

    def install(self, hooks: Hooks, schedule: Schedule) -> None:
        def on_p2p_send(value: float, ctx: dict[str, Any]) -> float:
            if self.msg != "all" and ctx.get("msg") != self.msg:
                return value  # not an opportunity: another message
            if not self.ms or not schedule.fires(ctx["step"]):
                return value
            hooks.record(self.NAME, msg=ctx.get("msg"), delay_ms=self.ms)
            return value + self.ms / 1000.0

        hooks.register("p2p_send", on_p2p_send)
