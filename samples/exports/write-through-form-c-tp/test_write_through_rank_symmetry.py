"""A write-through backup decided on one rank alone, SGLang 0.5.23.

Exported from a hicache-diag run (sglang-0.5.23-form-c-tp): at step 46 rank 1 (TP1) skipped a write-through backup of 1 tokens (`host_shortages` {'evict_calls': 1, 'evicted': 0, 'free': 0, 'need': 1}), rank 0 (TP0) backed up 1 tokens. The backup is decided on each rank
alone (`_execute_kv_backup` returns None when the host pool is short and `evict_host` cannot
free enough) and no peer is told; the ranks then agree only on how many acks to drain: under PP
PP0 counts its own queue and relays the count (`_pp_sync`), under TP the counts are MIN-reduced.
So either a rank drains an ack it never enqueued (a PP follower short: `IndexError`) or a rank
keeps an ack, and its node locked, that its peers never had (PP0 short, or a TP rank short).

This test drives the installed release's real code: `_apply_cache_action(BackupKV)` ->
`_execute_and_commit_kv_backup` -> `_execute_kv_backup` (the real shortage branch: host room
short, `evict_host` frees nothing) on the short rank only, then one `check_hicache_events` ->
`_sync_hicache_ready_counts` -> `_all_reduce` -> `writing_check` round on both ranks, each in
its own thread as each scheduler is its own process. Only the controller, the tree core and the
collectives are stand-ins: `_pp_sync` hands PP0's tensor to PP1 as the real isend/recv pair
does, `_all_reduce_attn_groups` MIN-reduces over the two TP ranks as `all_reduce` does.

Invariant: after an ack round every rank holds the same write-through state: the same nodes
still being backed up (locked), the same host backups committed and the same host slots taken.
It fails on an affected release, still fails under a non-fix that only hides the symptom (a
capped pop, each rank draining the acks it has ready itself), and skips on a release that no
longer has this code path.

Run: python -m pytest -q test_write_through_rank_symmetry.py   (plain pytest, against the installed SGLang)
"""

import queue
import threading
import unittest
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from unittest.mock import MagicMock

import torch

try:
    from sglang.srt.mem_cache.unified_cache.cache_action import BackupKV
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
except ImportError:  # a release without the unified radix cache
    UnifiedRadixCache = None

# From the run: the write one rank backed up (1 tokens, into 513 free host
# slots) while the short rank (tp rank 1) could not.
TOPOLOGY = "tp"  # "pp": two PP stages, TP 1; "tp": two TP ranks, PP 1
SHORT_RANK = 1
NODE_ID = 1
KV_TOKENS = 1
ROOMY_HOST_FREE = 513
SHORT_HOST_FREE = KV_TOKENS - 1  # one slot short: the smallest real shortage

_PATH = ("_execute_and_commit_kv_backup", "_execute_kv_backup", "evict_host",
         "check_hicache_events", "_sync_hicache_ready_counts", "writing_check", "_pp_sync",
         "_all_reduce_attn_groups")


class _Ready:
    def query(self):
        return True

    def synchronize(self):
        pass


class _HostPool:
    def __init__(self, free):
        self.free = free
        self.anchor_entry = SimpleNamespace(
            host_pool=SimpleNamespace(shared_allocation_domain=None), host_evict_fn=None
        )

    def available_size(self):
        return self.free


class _Controller:
    """HiCacheController's write/ack surface: `write` allocates host slots (None when short),
    `start_writing` turns the pending writes into one ack, as the real flush does."""

    def __init__(self, host_free):
        self.mem_pool_host = _HostPool(host_free)
        self.ack_write_queue = []
        self.ack_load_queue = []
        self._pending = []

    def write(self, device_indices, node_id=None, extra_pools=None, flush=True, **_):
        n = len(device_indices)
        if self.mem_pool_host.free < n:
            return None
        self.mem_pool_host.free -= n
        self._pending.append(node_id)
        return torch.arange(n, dtype=torch.int64)

    def start_writing(self):
        if self._pending:
            ack = SimpleNamespace(node_ids=list(self._pending), finish_event=_Ready(),
                                  num_tokens_by_pool={})
            self.ack_write_queue.append(ack)
            self._pending = []


class _Group:
    """The two ranks' collectives: PP0 -> PP1 relay (`_pp_sync`), TP MIN all-reduce."""

    def __init__(self):
        self.relay = queue.Queue()
        self.barrier = threading.Barrier(2, timeout=10)
        self.slots = [None, None]

    def pp_sync(self, pp_rank):
        def pp_sync(data):
            if pp_rank == 0:
                self.relay.put(data.clone())
            else:
                data.copy_(self.relay.get(timeout=10))

        return pp_sync

    def tp_min(self, tp_rank):
        def all_reduce_attn_groups(tensor, op):
            self.slots[tp_rank] = tensor.clone()
            self.barrier.wait()
            tensor.copy_(torch.minimum(self.slots[0], self.slots[1]))
            self.barrier.wait()

        return all_reduce_attn_groups


def _nothing_evictable(component_type, num_tokens):
    return SimpleNamespace(tracker={}, device_frees={}, host_frees={}, cache_actions=[])


def _make_rank(rank, group):
    cache = object.__new__(UnifiedRadixCache)
    cache.pp_rank = rank if TOPOLOGY == "pp" else 0
    cache.pp_size = 2 if TOPOLOGY == "pp" else 1
    cache.tp_world_size = 2 if TOPOLOGY == "tp" else 1
    cache.pp_group = None
    cache.attn_cp_group = None
    cache.attn_tp_group = None
    cache.host_memory_mode = "cache"
    cache.enable_storage_metrics = False
    cache.storage_metrics_collector = None
    cache.metrics_collector = None
    cache.buffer_pipeline = None
    cache.linker = None
    cache.sidecar_pool_specs = []
    cache.work_list = []
    cache.ongoing_write_through = {}
    cache.ongoing_load_back = {}
    cache.tree_core = SimpleNamespace(
        enable_storage=False,
        write_back_duplicate_reclaim_digest=0,
        build_backup_spec=lambda node_id: (torch.arange(KV_TOKENS, dtype=torch.int64), {}),
        commit_backup=MagicMock(),
        rotation_phase_of=lambda node_id: None,
        # 0.5.20+: (node_ids, ack_id), publishes what it returns; 0.5.18-0.5.19: (node_id)
        mark_write_through_pending=lambda ids, ack_id=None: None if ack_id is None else list(ids),
        finish_write_through=MagicMock(),
        drive_host_eviction=_nothing_evictable,
    )
    cache.inc_lock_ref = MagicMock(return_value=SimpleNamespace(to_dec_params=lambda: "lock"))
    cache.dec_lock_ref = MagicMock()
    cache._pp_sync = group.pp_sync(rank)
    if TOPOLOGY == "tp":  # under PP (TP 1) the real one reduces over no group at all
        cache._all_reduce_attn_groups = group.tp_min(rank)
    free = SHORT_HOST_FREE if rank == SHORT_RANK else ROOMY_HOST_FREE
    cache.cache_controller = _Controller(free)
    cache.host_free_before = free
    return cache


def _state(cache):
    """What must agree across ranks: nodes still locked for a backup, backups committed, host
    slots taken."""
    used = cache.host_free_before - cache.cache_controller.mem_pool_host.free
    return (sorted(cache.ongoing_write_through), cache.tree_core.commit_backup.call_count, used)


@unittest.skipIf(UnifiedRadixCache is None, "this SGLang has no UnifiedRadixCache")
class TestWriteThroughRankSymmetry(unittest.TestCase):
    def setUp(self):
        missing = [name for name in _PATH if not hasattr(UnifiedRadixCache, name)]
        if missing:
            self.skipTest(f"code path gone in this release: {', '.join(missing)}")

    def test_one_rank_short_of_host_memory_keeps_write_through_state_equal(self):
        group = _Group()
        ranks = [_make_rank(0, group), _make_rank(1, group)]

        # The same insert on both ranks emits the same BackupKV; each rank decides alone.
        for rank in ranks:
            rank._apply_cache_action(BackupKV(node_ids=[NODE_ID]))
        backed = [len(r.ongoing_write_through) for r in ranks]
        self.assertEqual(backed[SHORT_RANK], 0, "the short rank's shortage branch was not taken")
        self.assertEqual(backed[1 - SHORT_RANK], 1)

        # One ack round, each rank in its own thread (a rank that raises raises here).
        with ThreadPoolExecutor(2) as pool:
            for done in [pool.submit(r.check_hicache_events) for r in ranks]:
                done.result(timeout=30)

        word = TOPOLOGY.upper()
        states = [_state(r) for r in ranks]
        self.assertEqual(
            states[0], states[1],
            "(locked for backup, backups committed, host slots taken): "
            f"{word}0 {states[0]}, {word}1 {states[1]}",
        )


if __name__ == "__main__":
    unittest.main()
