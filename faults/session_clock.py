"""session-clock: one rank's session reap tick runs out of phase with the other ranks'.

SGLang 0.5.23 reaps sessions on a per-rank 1 s tick: `process_input_requests` calls
`SessionController.maybe_reap(time.monotonic())`, which acts only when a second has passed
since that rank's last reap (its first call reaps at once: `_last_reap_time` starts at 0.0).
Deferred closes and session timeouts are applied at that tick, so a rank's tick phase — set by
when its scheduler loop started — decides in which slot it frees a session (docs/faults.md).
`phase-ms` holds this rank's tick back once, when it first falls due inside the step window:
every later tick keeps the new phase, as a rank whose loop started that much later would. A
phase is less than the tick's interval, so every value is one SGLang reaches without us.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from hicache_diag.errors import UsageError
from hicache_diag.faults import keys as K
from hicache_diag.faults.base import Fault

if TYPE_CHECKING:
    from hicache_diag.faults.hooks import Hooks
    from hicache_diag.faults.schedule import Schedule

REAP_INTERVAL_MS = 1000.0  # SessionController.maybe_reap's default interval


@dataclass(frozen=True, slots=True)
class SessionClock(Fault):
    NAME: ClassVar[str] = "session-clock"
    POINTS: ClassVar[tuple[str, ...]] = ("session_clock",)
    SUMMARY: ClassVar[str] = "the phase of one rank's 1 s session reap tick (its loop's start)"
    EFFECT_KEYS: ClassVar[tuple[str, ...]] = ("phase-ms",)
    EVENT: ClassVar[str] = (
        "one rank's session reap tick has another phase than its peers': each scheduler reaps "
        "when a second has passed since its own last reap, from its own loop's start"
    )
    WHEN: ClassVar[str] = (
        "always, on every PP/TP rank of a server with streaming sessions: the phase is set by "
        "when that rank's loop started; deferred closes and session timeouts act only at it"
    )
    ACTS_IN: ClassVar[tuple[tuple[str, str], ...]] = (
        (
            "0.5.12.post1-0.5.23",
            "SessionController.maybe_reap (session/session_controller.py, "
            "called from Scheduler.process_input_requests)",
        ),
    )
    CANNOT: ClassVar[str] = (
        "a phase of a second or more (refused); a clock running at another rate; the "
        "last_active_time each rank stamps when the turn reaches it (stays natural)"
    )
    BUILTIN_REFUSAL: ClassVar[str] = (
        "the builtin runtime has no sessions, so no session reap tick to shift "
        "(use --engine sglang with a release that has SessionController.maybe_reap)"
    )

    phase_ms: float = K.key(
        0.0, K.millis, "milliseconds this rank's reap tick is held back once (0 <= phase < 1000)"
    )

    def check(self, given: set[str]) -> None:
        Fault.check(self, given)
        if self.phase_ms >= REAP_INTERVAL_MS:
            raise UsageError(
                f"fault {self.NAME!r}: phase-ms={self.phase_ms:g} is not a phase of SGLang's "
                f"{REAP_INTERVAL_MS:g} ms reap tick; use 0 <= phase-ms < {REAP_INTERVAL_MS:g}"
            )

    def install(self, hooks: Hooks, schedule: Schedule) -> None:
        state: dict[str, Any] = {"shifted": False}

        def on_session_clock(value: float, ctx: dict[str, Any]) -> float:
            # One shift only: holding every tick back would slow the tick, not move its phase.
            if state["shifted"] or not self.phase_ms or not schedule.fires(ctx["step"]):
                return value
            state["shifted"] = True
            hooks.record(self.NAME, phase_ms=self.phase_ms)
            return value + self.phase_ms / 1e3

        hooks.register("session_clock", on_session_clock)
