"""session-clock and flush-clock: their keys and refusals, what they return at their points, and
the plugin wrappers that apply them to SessionController.maybe_reap / SchedulerFlushWrapper.handle
(stand-ins with the attributes SGLang 0.5.23's classes have; the real ones run in e2e)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hicache_diag.engines.builtin.options import BuiltinOptions
from hicache_diag.engines.sglang.options import SglangOptions
from hicache_diag.engines.sglang.plugin import hook_points
from hicache_diag.engines.sglang.plugin.recorder import StepRecorder
from hicache_diag.errors import UsageError
from hicache_diag.faults import install_faults, parse_fault_spec
from hicache_diag.faults.hooks import Hooks
from hicache_diag.faults.validate import validated_faults


def _hooks(*specs, rank=1):
    hooks = Hooks(rank=rank, pp_rank=rank, tp_rank=0)
    install_faults(hooks, list(specs), 0, rank=rank, pp_rank=rank, tp_rank=0)
    return hooks


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("session-clock:rank=1", "does nothing without one of: phase-ms"),
        ("session-clock:phase-ms=1000", "not a phase of SGLang's 1000 ms reap tick"),
        ("session-clock:phase-ms=-5", "milliseconds from 0 to 86400000"),
        ("flush-clock:rank=1", "does nothing without one of: offset-ms"),
        ("flush-clock:offset-ms=soon", "expected a number"),
    ],
)
def test_bad_specs_are_one_line_usage_errors(spec, needle):
    with pytest.raises(UsageError) as err:
        parse_fault_spec(spec)
    assert needle in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("name", ["session-clock", "flush-clock"])
def test_builtin_engine_refuses_with_the_reason_sglang_engine_accepts(name):
    spec = {"session-clock": "session-clock:phase-ms=500", "flush-clock": "flush-clock:offset-ms=9"}
    with pytest.raises(UsageError) as err:
        validated_faults(BuiltinOptions(faults=(spec[name],)))
    assert f"fault {name!r} cannot run on --engine builtin: the builtin runtime has no" in str(
        err.value
    )
    # the sglang engine: no refusal
    assert validated_faults(SglangOptions(faults=(spec[name],))) == (spec[name],)


def test_session_clock_shifts_the_tick_once_in_its_window_and_records_it():
    hooks = _hooks("session-clock:rank=1,phase-ms=400,after=5")
    hooks.step = 4
    assert hooks.apply("session_clock", 0.0) == 0.0  # before the window
    hooks.step = 5
    assert hooks.apply("session_clock", 0.0) == pytest.approx(0.4)
    hooks.step = 6
    assert hooks.apply("session_clock", 0.0) == 0.0  # one shift: a phase, not a slower tick
    assert hooks.drain_fired() == [{"fault": "session-clock", "step": 5, "phase_ms": 400.0}]
    other = _hooks("session-clock:rank=1,phase-ms=400", rank=0)
    assert other.apply("session_clock", 0.0) == 0.0


def test_flush_clock_offsets_every_deadline_in_its_window():
    hooks = _hooks("flush-clock:rank=1,offset-ms=-250")
    assert hooks.apply("flush_clock", 0.0, timeout_s=2.0) == pytest.approx(-0.25)
    assert hooks.apply("flush_clock", 0.0, timeout_s=1.0) == pytest.approx(-0.25)
    fired = hooks.drain_fired()
    assert [f["timeout_s"] for f in fired] == [2.0, 1.0]


class _Controller:
    """SessionController's reap as in sglang/srt/session/session_controller.py (0.5.23)."""

    def __init__(self):
        self.sessions = {"a": 1, "b": 2}
        self._last_reap_time = 0.0
        self.reaps: list[float] = []

    def maybe_reap(self, now, interval=1.0):
        if now - self._last_reap_time > interval:
            self._last_reap_time = now
            self.reaps.append(now)
            if self.sessions:  # one session timed out per tick
                self.sessions.pop(next(iter(self.sessions)))


def test_reap_wrapper_moves_the_tick_phase_and_counts_closed_sessions(tmp_path):
    hooks = _hooks("session-clock:rank=1,phase-ms=300")
    rec = StepRecorder(str(tmp_path / "rank1.jsonl"), 1, 1, 0, hooks)
    hook_points.STATE.hooks, hook_points.STATE.recorder = hooks, rec
    try:
        reap = hook_points._wrap_maybe_reap(_Controller.maybe_reap)
        ctl = _Controller()
        for now in (10.0, 10.1, 10.2, 10.31, 11.0, 11.32, 12.0, 12.33):
            reap(ctl, now)
        # The first tick was due at 10.0 and held to 10.3; the phase stays 0.3 s later after.
        assert ctl.reaps == [10.31, 11.32, 12.33]
        assert rec._counts["sessions_closed"] == 2  # two sessions to close, then none left
    finally:
        hook_points.reset()


def test_reap_wrapper_without_a_fault_is_sglangs_own_tick():
    hook_points.reset()
    reap = hook_points._wrap_maybe_reap(_Controller.maybe_reap)
    ctl = _Controller()
    for now in (10.0, 10.5, 11.01, 11.5):
        reap(ctl, now)
    assert ctl.reaps == [10.0, 11.01]


class _FlushWrapper:
    """SchedulerFlushWrapper.handle as in managers/scheduler_components/flush_wrapper.py."""

    def __init__(self, idle: bool):
        self._pending, self.idle = None, idle

    def handle(self, recv_req):
        if self._pending is not None:
            return "busy"
        if not recv_req.timeout_s or self.idle:
            return "flushed"
        self._pending = (recv_req, 100.0 + recv_req.timeout_s)
        return None


def test_flush_wrapper_moves_only_a_new_deferred_deadline():
    hooks = _hooks("flush-clock:rank=1,offset-ms=1500")
    hook_points.STATE.hooks = hooks
    try:
        handle = hook_points._wrap_flush_handle(_FlushWrapper.handle)
        busy = _FlushWrapper(idle=False)
        req = SimpleNamespace(timeout_s=2.0)
        assert handle(busy, req) is None
        assert busy._pending == (req, pytest.approx(103.5))
        assert handle(busy, SimpleNamespace(timeout_s=9.0)) == "busy"
        assert busy._pending[1] == pytest.approx(103.5)  # the pending one is not moved again
        assert handle(_FlushWrapper(idle=True), req) == "flushed"  # nothing deferred: no clock
        assert len(hooks.drain_fired()) == 1
    finally:
        hook_points.reset()
