"""Requests past SGLANG_REQ_WAITING_TIMEOUT are dropped on each rank's own clock, SGLang 0.5.18.

Exported from a hicache-diag run (overload-waiting-timeout, no fault injected): the waiting timeout dropped o088 on rank 0 at step 1586 and not on every rank (`sources.waiting-clock`; 2 such drops in the run)

Each scheduler stamps `req.time_stats.wait_queue_entry_time` when it queues a request and, every
iteration, drops the waiting requests older than the timeout by its own `time.perf_counter()`
(`Scheduler._abort_on_waiting_timeout`). PP stages (and TP ranks) queue the same request and
check it at different wall times, so a request near the deadline is dropped on one rank a step
before the other: the stages then run different requests in the same step.

This test builds one real `Scheduler` per simulated rank (`object.__new__`, the release's
method; the tokenizer channel is a recorder), queues the same request on both at the same step,
gives each rank its own clock (PP1 reads it after PP0's work of the step reached it,
PIPE_LAG_S), and runs the release's per-iteration timeout step on both. Where the release has
`Scheduler._poll_timeout_aborts` instead (#37143: the request-pulling rank decides and the aborts
travel with the requests), PP0 polls and the aborts it emits are applied on every rank.
Invariant: after every step both ranks hold the same waiting queue.

Run: python -m pytest -q test_waiting_timeout_rank_symmetry.py   (plain pytest, against the installed SGLang)
"""

import os
import unittest
from types import SimpleNamespace
from unittest import mock

try:
    from sglang.srt.managers import scheduler as scheduler_module
    from sglang.srt.managers.scheduler import Scheduler
except ImportError:  # pragma: no cover - a release without this module
    Scheduler = None

START = 1000.0  # the step the request is queued (s, perf_counter)
STEP_S = 0.25  # one scheduler iteration
PIPE_LAG_S = {0: 0.375}  # PP1 waits for PP0's prefill at step 0
DECODE_LAG_S = 0.125  # and for PP0's decode on the other steps
TIMEOUT_S = "1.5"  # SGLANG_REQ_WAITING_TIMEOUT, as the run set it
STEPS = 12


def _per_rank_step():
    if hasattr(Scheduler, "_abort_on_waiting_timeout"):
        return "_abort_on_waiting_timeout"
    if hasattr(Scheduler, "_poll_timeout_aborts"):
        return "_poll_timeout_aborts"
    return None


class _Req:
    """A queued request as the timeout step reads it (hashable, as `Req` is)."""

    def __init__(self, rid, entry_time):
        self.rid = rid
        self.time_stats = SimpleNamespace(wait_queue_entry_time=entry_time)
        self.output_ids = []
        self.weight_version_events = []


class _Rank:
    def __init__(self, pp_rank):
        self.pp_rank = pp_rank
        self.now = START
        s = object.__new__(Scheduler)
        s.waiting_queue = []
        s.enable_hicache_storage = False
        s.tree_cache = mock.MagicMock()
        s.ipc_channels = SimpleNamespace(send_to_tokenizer=mock.MagicMock())
        s.beam_coordinator = mock.MagicMock()
        s.ps = SimpleNamespace(pp_rank=pp_rank, pp_size=2, attn_tp_rank=0, attn_cp_rank=0)
        s.running_batch = s.last_batch = None
        s.running_mbs, s.mbs = [], []
        self.scheduler = s

    def at(self, k):
        lag = PIPE_LAG_S.get(k, DECODE_LAG_S) if self.pp_rank else 0.0
        self.now = START + k * STEP_S + lag
        clock = SimpleNamespace(perf_counter=lambda: self.now)
        return mock.patch.object(scheduler_module, "time", clock)

    def queue(self, rid):
        # What each rank's `_add_request_to_queue` stamps: its own clock at queueing.
        self.scheduler.waiting_queue.append(_Req(rid, self.now))

    def rids(self):
        return [r.rid for r in self.scheduler.waiting_queue]


def _drop(rank, rids):
    # What `abort_request` does to a waiting request named by an AbortReq.
    rank.scheduler.waiting_queue = [r for r in rank.scheduler.waiting_queue if r.rid not in rids]


@unittest.skipIf(Scheduler is None or _per_rank_step() is None,
                 "this SGLang has no waiting-timeout step")
class TestWaitingTimeoutRankSymmetry(unittest.TestCase):
    def test_same_waiting_queue_on_every_rank(self):
        ranks = [_Rank(0), _Rank(1)]
        step = _per_rank_step()
        made = getattr(scheduler_module, "_make_abort_req", None)
        patches = [mock.patch.dict(os.environ, {"SGLANG_REQ_WAITING_TIMEOUT": TIMEOUT_S})]
        if made is not None:  # the abort message to the tokenizer (not the decision)
            patches.append(mock.patch.object(scheduler_module, "_make_abort_req",
                                             lambda req, finished_reason=None: req.rid))
        with patches[0], (patches[1] if len(patches) > 1 else mock.MagicMock()):
            for k in range(STEPS):
                aborts = []
                for rank in ranks:
                    with rank.at(k):
                        if k == 0:
                            rank.queue("o012")
                        if step == "_abort_on_waiting_timeout":
                            rank.scheduler._abort_on_waiting_timeout()
                        elif rank.pp_rank == 0:
                            aborts = [a.rid for a in rank.scheduler._poll_timeout_aborts()]
                for rank in ranks:
                    _drop(rank, aborts)
                self.assertEqual(
                    ranks[0].rids(), ranks[1].rids(),
                    f"step {k}: PP0 waiting {ranks[0].rids()}, PP1 waiting {ranks[1].rids()}",
                )


if __name__ == "__main__":
    unittest.main()
