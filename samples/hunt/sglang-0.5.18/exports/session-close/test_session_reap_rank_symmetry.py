"""Streaming sessions are released on each rank's own reap tick, SGLang 0.5.18.

Exported from a hicache-diag run (session-close, no fault injected): the reap tick closed a session on one rank only (`sessions_closed` / `sources.session-clock`): rank 0 at step(s) 953, 1712, 2446; rank 1 at step(s) 953, 1712, 2445

`Scheduler.process_input_requests` calls `SessionController.maybe_reap(time.monotonic())` on
every rank. `maybe_reap` runs only when that rank's own 1 s tick fires (`_last_reap_time` is
per rank and starts at 0.0), and `Session.is_timed_out` compares that rank's own clock with
that rank's own `last_active_time`. Deferred closes and timeouts then call
`tree_cache.release_session` at a step that depends on each rank's clock, so two PP stages
(or TP ranks) running the same batches release the same session at different steps.

This test builds one real `SessionController` per simulated rank (the release's class, only
the tree cache is a recorder), feeds both the same inputs at the same scheduler steps, and
gives each rank its own clock, as production has:
  - each rank's last reap tick before the first request was set while it polled idle from its
    own start (PP0 booted at BOOT_S[0], PP1 at BOOT_S[1]);
  - in lock-step, PP1 reads its clock after PP0's work of the step reached it (PIPE_LAG_S).
Invariant: after every scheduler step both ranks hold the same sessions and have released the
same ones. It fails on an affected release at the first step where they differ.

Run: python -m pytest -q test_session_reap_rank_symmetry.py   (plain pytest, against the installed SGLang)
"""

import unittest
from types import SimpleNamespace
from unittest import mock

try:
    from sglang.srt.managers.io_struct import CloseSessionReqInput, OpenSessionReqInput
    from sglang.srt.session import session_controller as controller_module
    from sglang.srt.session.session_controller import SessionController
except ImportError:  # a release without sglang.srt.session
    SessionController = None

START = 1000.0  # the first shared scheduler step (s, monotonic)
STEP_S = 0.25  # one scheduler iteration
BOOT_S = (990.0, 990.5)  # each rank's first idle poll (its own start)
PIPE_LAG_S = {0: 0.375}  # PP1 waits for PP0's prefill at step 0
DECODE_LAG_S = 0.125  # and for PP0's decode on the other steps
STEPS = 16
_PATH = ("maybe_reap", "_close", "open", "close")


class _Rank:
    """One scheduler's session state: the release's SessionController on this rank's clock."""

    def __init__(self, pp_rank):
        self.pp_rank = pp_rank
        self.now = BOOT_S[pp_rank]
        self.tree_cache = mock.MagicMock()
        with self._clock():
            self.controller = SessionController(self.tree_cache)
        # Idle polls before the first request: each rank ticks from its own start.
        while self.now < START - STEP_S / 2:
            self.controller.maybe_reap(self.now)
            self.now += STEP_S

    def _clock(self):
        clock = SimpleNamespace(monotonic=lambda: self.now)
        return mock.patch.object(controller_module, "time", clock)

    def step(self, k, inputs):
        """One `process_input_requests`: the reap on this rank's clock, then the inputs."""
        lag = PIPE_LAG_S.get(k, DECODE_LAG_S) if self.pp_rank else 0.0
        self.now = START + k * STEP_S + lag
        with self._clock():
            self.controller.maybe_reap(self.now)
            for apply in inputs:
                apply(self.controller)

    def released(self):
        return [c.args[0] for c in self.tree_cache.release_session.call_args_list]


def _open(sid, timeout=None):
    req = OpenSessionReqInput(capacity_of_str_len=64, session_id=sid, streaming=True,
                              timeout=timeout)
    return lambda c: c.open(req)


def _turn_admitted(sid):
    # What `Session.create_req` does for a streaming session when the scheduler admits a turn.
    def apply(c):
        c.get(sid)._inflight = True

    return apply


def _turn_finished(sid, rid):
    # What the scheduler's finish path does when the turn's request finishes.
    req = SimpleNamespace(rid=rid, origin_input_ids=[1, 2, 3], origin_input_ids_unpadded=[1, 2, 3],
                          full_untruncated_fill_ids=[1, 2, 3], session=sid,
                          multimodal_inputs=None, finished=lambda: True)
    return lambda c: c.get(sid).finish_req(req)


def _close(sid):
    req = CloseSessionReqInput(session_id=sid)
    return lambda c: c.close(req)


@unittest.skipIf(SessionController is None, "this SGLang has no sglang.srt.session")
class TestSessionReapRankSymmetry(unittest.TestCase):
    def setUp(self):
        missing = [n for n in _PATH if not hasattr(SessionController, n)]
        if missing:
            self.skipTest(f"code path gone in this release: {', '.join(missing)}")

    def _drive(self, schedule):
        ranks = [_Rank(0), _Rank(1)]
        for k in range(STEPS):
            for rank in ranks:
                rank.step(k, schedule.get(k, ()))
            held = [sorted(r.controller.sessions) for r in ranks]
            released = [r.released() for r in ranks]
            self.assertEqual(
                (held[0], released[0]), (held[1], released[1]),
                f"step {k}: PP0 holds {held[0]} and released {released[0]}, "
                f"PP1 holds {held[1]} and released {released[1]}",
            )
        return ranks

    def test_deferred_close_released_at_the_same_step(self):
        # A session closed while its turn decodes: the close is deferred on both ranks and
        # carried out by the next reap tick after the turn finished.
        self._drive({0: [_open("c000"), _turn_admitted("c000")], 1: [_close("c000")],
                     3: [_turn_finished("c000", "c000-t0")]})

    def test_timed_out_session_released_at_the_same_step(self):
        # A session opened with a timeout and left idle: each rank's reap tick closes it.
        self._drive({0: [_open("s000", timeout=2.0)]})


if __name__ == "__main__":
    unittest.main()
