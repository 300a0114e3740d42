"""What the hook points share in one SGLang process: its rank's hooks and recorder, set by the
scheduler entry (boot.py); until then every hook point passes values through unchanged."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hicache_diag.faults.hooks import Hooks
    from hicache_diag.faults.side_pool import SidePool


@dataclass
class _State:
    hooks: Hooks | None = None  # of this scheduler process
    recorder: Any = None  # recorder.StepRecorder
    side_pool: SidePool | None = None  # made on the first host_hold
    scheduler: Any = None  # the Scheduler, once it stepped (the first-divergence block reads it)
    boundary: Any = None  # clean_state.Boundary: a warm server's trial boundary


STATE = _State()


def reset() -> None:
    STATE.hooks = STATE.recorder = STATE.side_pool = STATE.scheduler = None
    STATE.boundary = None


def apply_hook(point: str, value: Any, **ctx: Any) -> Any:
    hooks = STATE.hooks
    return value if hooks is None else hooks.apply(point, value, **ctx)
