"""PP follower consumes a write-through ack it never enqueued (form B), SGLang 0.5.23.

Exported from a hicache-diag run (trial0-seed0): PP1 raised `IndexError: pop from empty list` in
`UnifiedRadixCache.writing_check`. The write-through backup is decided on each rank alone
(`_execute_kv_backup` returns None when the host pool is short and `evict_host` cannot free
enough), while a PP follower pops as many acks as PP0 relays through `_pp_sync`, without
looking at its own queue.

This test drives the installed release's real code: `_apply_cache_action(BackupKV)` ->
`_execute_and_commit_kv_backup` -> `_execute_kv_backup` (the real shortage branch: host room
short, `evict_host` frees nothing) on the follower only, then `check_hicache_events` ->
`_sync_hicache_ready_counts` -> `_all_reduce` -> `writing_check` on both ranks. Only the
controller, the tree core and the PP relay are stand-ins (`_pp_sync` hands PP0's tensor to PP1,
as the real isend/recv pair does).

Invariant: after an ack round every PP rank holds the same write-through ledger (no rank
consumes an ack it does not have) and the same host backups (committed nodes, host slots
taken). It fails on an affected release with `IndexError: pop from empty list`, and still fails (on the
committed backups) when the follower's pop is merely capped at its own queue; it skips on a
release that no longer has this code path.

Run: python -m pytest -q test_pp_follower_write_through_ack.py   (plain pytest, against the installed SGLang)
"""

import unittest
from types import SimpleNamespace
from unittest.mock import MagicMock

import torch

try:
    from sglang.srt.mem_cache.unified_cache.cache_action import BackupKV
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
except ImportError:  # a release without the unified radix cache
    UnifiedRadixCache = None

# From the run: the write PP0 backed up while PP1 could not (56 tokens; PP0 had
# 516 host slots free).
NODE_ID = 1
KV_TOKENS = 56
LEADER_HOST_FREE = 516
FOLLOWER_HOST_FREE = KV_TOKENS - 1  # one slot short: the smallest real shortage

_PATH = ("_execute_and_commit_kv_backup", "_execute_kv_backup", "evict_host",
         "check_hicache_events", "_sync_hicache_ready_counts", "writing_check", "_pp_sync")


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


def _nothing_evictable(component_type, num_tokens):
    return SimpleNamespace(tracker={}, device_frees={}, host_frees={}, cache_actions=[])


def _make_rank(pp_rank, host_free, relay):
    cache = object.__new__(UnifiedRadixCache)
    cache.pp_rank = pp_rank
    cache.pp_size = 2
    cache.tp_world_size = 1
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
        mark_write_through_pending=lambda node_ids, ack_id: list(node_ids),
        finish_write_through=MagicMock(),
        drive_host_eviction=_nothing_evictable,
    )
    cache.inc_lock_ref = MagicMock(return_value=SimpleNamespace(to_dec_params=lambda: "lock"))
    cache.dec_lock_ref = MagicMock()
    cache._pp_sync = relay.for_rank(pp_rank)
    cache.cache_controller = _Controller(host_free)
    return cache


@unittest.skipIf(UnifiedRadixCache is None, "this SGLang has no UnifiedRadixCache")
class TestPPFollowerWriteThroughShortage(unittest.TestCase):
    def setUp(self):
        missing = [name for name in _PATH if not hasattr(UnifiedRadixCache, name)]
        if missing:
            self.skipTest(f"code path gone in this release: {', '.join(missing)}")

    def test_follower_host_shortage_keeps_ack_ledgers_equal(self):
        relay = _Relay()
        leader = _make_rank(0, LEADER_HOST_FREE, relay)
        follower = _make_rank(1, FOLLOWER_HOST_FREE, relay)

        # The same insert on both stages emits the same BackupKV.
        for rank in (leader, follower):
            rank._apply_cache_action(BackupKV(node_ids=[NODE_ID]))
        # Each rank decided alone: PP0 backed the node up, PP1's host pool was short.
        self.assertEqual(
            (len(leader.ongoing_write_through), len(follower.ongoing_write_through)), (1, 0)
        )

        # One ack round, leader first (the relay is PP0 -> PP1).
        leader.check_hicache_events()
        follower.check_hicache_events()

        self.assertEqual(set(leader.ongoing_write_through), set(follower.ongoing_write_through))
        self.assertEqual(len(follower.cache_controller.ack_write_queue), 0)
        # The state that must agree, not only "nothing raised": a follower that merely stops
        # popping (caps its pop at its own queue) still holds no host backup PP0 committed.
        used = [LEADER_HOST_FREE - leader.cache_controller.mem_pool_host.free,
                FOLLOWER_HOST_FREE - follower.cache_controller.mem_pool_host.free]
        committed = [r.tree_core.commit_backup.call_count for r in (leader, follower)]
        self.assertEqual(
            (committed[0], used[0]), (committed[1], used[1]),
            f"PP0 committed {committed[0]} host backup(s) taking {used[0]} host slots, "
            f"PP1 committed {committed[1]} taking {used[1]}",
        )


if __name__ == "__main__":
    unittest.main()
