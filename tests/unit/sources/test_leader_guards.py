"""A clock read in a function only a leader runs is a single decision point (leader-decision,
covers PP); the same read in a function every rank runs has no alignment (0.5.19 -> 0.5.20's
waiting-timeout aborts, upstream #37143)."""

from __future__ import annotations

from tests.unit.sources.tree import only, scan

BODY = """
import time

class Scheduler:
    def _poll_timeout_aborts(self):
        deadline = time.perf_counter() - 1.0
        aborts = []
        for req in self.waiting_queue:
            if req.entry < deadline:
                aborts.append(req)
        return aborts
"""
GUARDED = (
    BODY
    + """
    def process_input_requests(self):
        local = []
        if self.pp_rank == 0 and self.attn_tp_rank == 0 and self.attn_cp_rank == 0:
            local = self._poll_timeout_aborts()
        return self.recv(local)
"""
)
EVERY_RANK = (
    BODY
    + """
    def get_next_batch_to_run(self):
        self._poll_timeout_aborts()
"""
)
PP_ONLY = (
    BODY
    + """
    def process_input_requests(self):
        if self.pp_rank == 0:
            self._poll_timeout_aborts()
"""
)


def _abort(tmp_path, text):
    inv = scan(tmp_path, {"managers/scheduler.py": text})
    return only(inv, function="Scheduler._poll_timeout_aborts", kind="clock")


def test_a_leaders_own_function_is_a_single_decision(tmp_path):
    src = _abort(tmp_path, GUARDED)
    assert src.decisions == ("request-abort",)
    a = src.alignment
    assert (a.mechanism, a.covers_pp, a.covers_tp) == ("leader-decision", True, True)


def test_a_function_every_rank_runs_has_no_alignment(tmp_path):
    assert _abort(tmp_path, EVERY_RANK).alignment.mechanism == "none"


def test_a_pp0_only_guard_leaves_tp_uncovered(tmp_path):
    a = _abort(tmp_path, PP_ONLY).alignment
    assert (a.mechanism, a.covers_pp, a.covers_tp) == ("leader-decision", True, False)
