"""PP stages apply different numbers of L3 storage control events (SGLang 0.5.18).

Exported from a hicache-diag run (sglang-0.5.18-l3-no-fault): with an L3 storage backend and no fault injected,
the run ended with PP0 in `SchedulerPPMixin._pp_commit_comm_work`: hang: no progress for the hang timeout; rank 0 waits in SchedulerPPMixin._pp_commit_comm_work (scheduler_pp_mixin.py:939). The source is upstream of where the
ranks stopped: each PP stage drains its storage control queues (`prefetch_hit_queue`,
`ack_backup_queue`, `host_mem_release_queue`) by a count that is the MIN over its own TP group
only (`drain_storage_control_queues` -> `_all_reduce_attn_groups`), and those queues are filled
by each stage's own storage threads, at the pace of its own IO. So one stage frees or allocates
host memory for an event the other stage applies a step later, or never in the same step; its
host pool then differs, a later write-through or load-back is enqueued on one stage only, and the
follower pops PP0's relayed ack count from a queue that lacks it.

This test drives the installed release's real `drain_storage_control_queues` and
`_drain_storage_control_queues_impl` on PP0 and PP1. Only the controller's queues and host pool
and the PP relay are stand-ins (`_pp_sync` hands PP0's tensor to PP1, as the real isend/recv pair
does). PP0's storage thread has released one page of host memory; PP1's releases the same page
a moment later (a real thread, 0.2 s), as a slower IO path does.

Invariant: after a drain round every PP stage has applied the same storage control events (here:
the same host-pool frees). It fails on an affected release (PP1 frees nothing); a release that
relays PP0's counts and waits for them passes; a release without HiRadixCache skips.

Run: python -m pytest -q test_pp_storage_control_drain.py   (plain pytest, against the installed SGLang)
"""

import threading
import unittest
from queue import Queue
from types import SimpleNamespace

import torch

try:
    from sglang.srt.mem_cache.hiradix_cache import HiRadixCache
except ImportError:  # a release without HiRadixCache (0.5.21 on: UnifiedRadixCache only)
    HiRadixCache = None

PAGE = 4  # host slots of one released backup page
FOLLOWER_IO_DELAY_S = 0.2

_PATH = ("drain_storage_control_queues", "_drain_storage_control_queues_impl", "_pp_sync")


class _HostPool:
    def __init__(self):
        self.freed = 0

    def free(self, indices):
        self.freed += len(indices)
        return len(indices)


class _Relay:
    """`_pp_sync` over two stages: PP0 sends its tensor, PP1 receives it in place."""

    def __init__(self):
        self.sent = []

    def for_rank(self, pp_rank):
        def pp_sync(data):
            if pp_rank == 0:
                self.sent.append(data.clone())
            else:
                data.copy_(self.sent.pop(0))

        return pp_sync


def _make_rank(pp_rank, relay):
    cache = object.__new__(HiRadixCache)
    cache.pp_rank = pp_rank
    cache.pp_size = 2
    cache.tp_world_size = 1
    cache.attn_cp_group = None
    cache.attn_tp_group = None
    cache.page_size = PAGE
    cache.prefetch_threshold = 256
    cache.enable_storage = True
    cache.enable_storage_metrics = False
    cache.storage_metrics_collector = None
    cache.metrics_collector = None
    cache.ongoing_prefetch = {}
    cache.ongoing_backup = {}
    cache.work_list = []
    cache._pp_sync = relay.for_rank(pp_rank)
    cache.cache_controller = SimpleNamespace(
        prefetch_hit_queue=Queue(),
        ack_prefetch_queue=Queue(),
        ack_backup_queue=Queue(),
        host_mem_release_queue=Queue(),
        mem_pool_host=_HostPool(),
        prefetch_buffer=Queue(),
    )
    return cache


@unittest.skipIf(HiRadixCache is None, "this SGLang has no HiRadixCache")
class TestPPStorageControlDrain(unittest.TestCase):
    def setUp(self):
        missing = [name for name in _PATH if not hasattr(HiRadixCache, name)]
        if missing:
            self.skipTest(f"code path gone in this release: {', '.join(missing)}")

    def test_pp_stages_apply_the_same_host_frees(self):
        relay = _Relay()
        leader = _make_rank(0, relay)
        follower = _make_rank(1, relay)

        leader.cache_controller.host_mem_release_queue.put(torch.arange(PAGE))
        late = threading.Timer(FOLLOWER_IO_DELAY_S,
                               follower.cache_controller.host_mem_release_queue.put,
                               (torch.arange(PAGE),))
        late.start()
        try:
            leader.drain_storage_control_queues()
            drain = threading.Thread(target=follower.drain_storage_control_queues, daemon=True)
            drain.start()
            drain.join(10)
            self.assertFalse(drain.is_alive(), "PP1's drain did not return within 10 s")
        finally:
            late.join()

        freed = (leader.cache_controller.mem_pool_host.freed,
                 follower.cache_controller.mem_pool_host.freed)
        self.assertEqual(
            freed[0], freed[1],
            f"host slots freed by one drain: PP0 {freed[0]}, PP1 {freed[1]} (each stage "
            "drained the release queue by its own count, not by PP0's)",
        )


if __name__ == "__main__":
    unittest.main()
