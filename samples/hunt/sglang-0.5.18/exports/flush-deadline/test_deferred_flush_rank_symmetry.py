"""A deferred /flush_cache ends by a per-rank deadline, SGLang 0.5.18.

Exported from a hicache-diag run (trial0-seed0): `sources.flush-deadline` ended the flush at steps {0: [683], 1: [741]}

`/flush_cache?timeout=T` reaches every scheduler; `SchedulerFlushWrapper.handle` stamps a
deadline `time.monotonic() + T` on each rank when that rank handles the request, and
`check_pending` (every `process_input_requests`) flushes when the rank is idle, or gives up
when that rank's own clock passes its own deadline. Ranks read their clocks at different
moments (PP1 handles the request after PP0's step reached it), so around the deadline one rank
gives up while the other, one step later and idle, resets its whole tree and allocators.

This test builds one real `SchedulerFlushWrapper` per simulated rank (the release's class; the
flush, the idle check and the reply are recorders), feeds both the same request and the same
busy/idle sequence, and gives each rank its own clock (PP1 reads it after PP0's work of the
step reached it, PIPE_LAG_S). Invariant: after every scheduler step both ranks have flushed the
same number of times and answered the same. It fails on an affected release at the first step
where they differ.

Run: python -m pytest -q test_deferred_flush_rank_symmetry.py   (plain pytest, against the installed SGLang)
"""

import unittest
from types import SimpleNamespace
from unittest import mock

try:
    from sglang.srt.managers.io_struct import FlushCacheReqInput
    from sglang.srt.managers.scheduler_components import flush_wrapper as wrapper_module
    from sglang.srt.managers.scheduler_components.flush_wrapper import SchedulerFlushWrapper
except ImportError:  # a release without the flush wrapper
    SchedulerFlushWrapper = None

START = 1000.0  # the step the flush request arrives (s, monotonic)
STEP_S = 0.25  # one scheduler iteration
PIPE_LAG_S = {0: 0.375}  # PP1 waits for PP0's prefill at step 0
DECODE_LAG_S = 0.125  # and for PP0's decode on the other steps
TIMEOUT_S = 2.0  # /flush_cache?timeout=2
BUSY_STEPS = 9  # the running batch finishes at step 8; both ranks are idle from step 9
STEPS = 12
_PATH = ("handle", "check_pending")


class _Rank:
    def __init__(self, pp_rank):
        self.pp_rank = pp_rank
        self.now = START
        self.step_no = 0
        self.flushes = []
        self.replies = []
        self.wrapper = SchedulerFlushWrapper(
            flush_cache=self._flush, is_fully_idle=lambda: self.step_no >= BUSY_STEPS,
            send_output=lambda out, req: self.replies.append((self.step_no, out.success)),
        )

    def _flush(self):
        self.flushes.append(self.step_no)  # tree_cache.reset() and the allocators' clear
        return True

    def step(self, k, request=None):
        """One `process_input_requests` on this rank's clock: the request, then check_pending."""
        lag = PIPE_LAG_S.get(k, DECODE_LAG_S) if self.pp_rank else 0.0
        self.step_no, self.now = k, START + k * STEP_S + lag
        clock = SimpleNamespace(monotonic=lambda: self.now)
        with mock.patch.object(wrapper_module, "time", clock):
            if request is not None:
                out = self.wrapper.handle(request)
                if out is not None:
                    self.replies.append((k, out.success))
            self.wrapper.check_pending()


@unittest.skipIf(SchedulerFlushWrapper is None, "this SGLang has no SchedulerFlushWrapper")
class TestDeferredFlushRankSymmetry(unittest.TestCase):
    def setUp(self):
        missing = [n for n in _PATH if not hasattr(SchedulerFlushWrapper, n)]
        if missing:
            self.skipTest(f"code path gone in this release: {', '.join(missing)}")

    def test_deferred_flush_same_outcome_on_every_rank(self):
        ranks = [_Rank(0), _Rank(1)]
        request = FlushCacheReqInput(timeout_s=TIMEOUT_S)
        for k in range(STEPS):
            for rank in ranks:
                rank.step(k, request if k == 0 else None)
            self.assertEqual(
                (ranks[0].flushes, ranks[0].replies), (ranks[1].flushes, ranks[1].replies),
                f"step {k}: PP0 flushed at steps {ranks[0].flushes} and answered "
                f"{ranks[0].replies}, PP1 flushed at {ranks[1].flushes} and answered "
                f"{ranks[1].replies} (step, success)",
            )


if __name__ == "__main__":
    unittest.main()
