"""rank-stall: one rank's scheduler thread sleeps before a step (GIL or CPU contention).

A short stall must be harmless under every protocol; a stall beyond `--hang-timeout` is how a
run gets a stalled rank for crash form C. The runtime does the sleeping: we return seconds.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from hicache_diag.faults import keys as K
from hicache_diag.faults.base import Fault

if TYPE_CHECKING:
    from hicache_diag.faults.hooks import Hooks
    from hicache_diag.faults.schedule import Schedule

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RankStall(Fault):
    NAME: ClassVar[str] = "rank-stall"
    POINTS: ClassVar[tuple[str, ...]] = ("scheduler_step",)
    SUMMARY: ClassVar[str] = "one rank's scheduler thread sleeps (GIL or CPU contention)"
    EFFECT_KEYS: ClassVar[tuple[str, ...]] = ("ms",)
    EVENT: ClassVar[str] = (
        "one rank's scheduler thread does not run for a while (GIL held by another thread, CPU "
        "contention, a page-fault storm, a debugger or SIGSTOP)"
    )
    WHEN: ClassVar[str] = "oversubscribed hosts, tokenizer or detokenizer threads, long GC pauses"
    ACTS_IN: ClassVar[tuple[tuple[str, str], ...]] = (
        ("0.5.12+", "Scheduler.get_next_batch_to_run: sleeps before the step"),
        ("builtin", "SchedulerPPMixin._pp_loop_step: sleeps before the step"),
    )
    CANNOT: ClassVar[str] = "a stall inside a forward or a collective (it sleeps between steps)"

    ms: float = K.key(0.0, K.millis, "milliseconds the scheduler thread sleeps before the step")
    every: int = K.key(1, K.count, "only every N-th step in the window stalls (default 1)")

    def install(self, hooks: Hooks, schedule: Schedule) -> None:
        def on_scheduler_step(value: float, ctx: dict[str, Any]) -> float:
            if not self.ms or not schedule.fires(ctx["step"]):
                return value
            # Recorded before the sleep: a stall past the hang timeout never finishes its step,
            # so the log line is the evidence that survives.
            logger.warning("rank-stall: stalling %.0f ms at step %d", self.ms, ctx["step"])
            hooks.record(self.NAME, stall_ms=self.ms)
            return value + self.ms / 1000.0

        hooks.register("scheduler_step", on_scheduler_step)
