"""HiRadixCache: write-through, demotion, host hits, load-back and the data they move."""

from __future__ import annotations

import pytest
import torch
from hicache_helpers import FakeComm, bundle_factory, put, settle

from hicache_diag.faults.hooks import Hooks


@pytest.fixture
def bundles():
    yield from bundle_factory()


def test_write_through_locks_until_ack_consumed(bundles):
    b = bundles("ack-count=local")
    tree = b.tree_cache
    put(b, [1, 1, 2, 2])
    assert tree.protected_size() == 4, "a node being written stays locked"
    assert len(b.controller.ack_write_queue) == 1
    settle(b)
    tree.check_hicache_events()
    assert tree.protected_size() == 0 and tree.evictable_size() == 4
    stats = tree.probe_stats()
    assert stats["write_backs"] == 4 and stats["acks_consumed"] == {"write": 1, "load": 0}
    phases = [(e["event"], e["phase"]) for e in stats["events"]]
    assert phases == [("write", "issued"), ("write", "queued"), ("write", "consumed")]
    tree.check_integrity()


def test_evict_demotes_then_load_back_restores_the_kv(bundles):
    b = bundles("ack-count=local")
    tree, pool = b.tree_cache, b.kv_pool
    key = [1, 1, 2, 2]
    value = b.allocator.alloc(4)
    for layer in pool.layer_ids:
        pool.set_kv_buffer(
            layer,
            value,
            torch.full((4, pool.head_num, pool.head_dim), 7.0),
            torch.ones(4, pool.head_num, pool.head_dim),
        )
    tree.insert(key, value)
    settle(b)
    tree.check_hicache_events()
    assert tree.evict(4) == 4
    m = tree.match_prefix(key + [3, 3])
    assert m.device_indices.numel() == 0 and m.host_hit_length == 4
    for layer in pool.layer_ids:  # scribble over the freed slots: the load must bring 7s back
        pool.k_buffer[layer - pool.layer_ids.start].zero_()
    indices, node = tree.init_load_back(m, mem_quota=32)
    assert indices.numel() == 4 and node is m.last_host_node
    assert tree.ready_to_load_host_cache() >= 0
    k, _ = pool.get_kv_buffer(pool.layer_ids[-1])  # waits for the last layer's load
    assert torch.all(k[indices] == 7.0)
    settle(b)
    tree.check_hicache_events()
    stats = tree.probe_stats()
    assert stats["load_backs"] == 4 and stats["acks_consumed"]["load"] == 1
    tree.check_integrity()


def test_unbacked_leaf_is_deleted_and_evict_host_frees_host(bundles):
    b = bundles("ack-count=local", hicache_write_policy="write_through_selective")
    tree = b.tree_cache
    put(b, [1, 1])
    assert not tree.match_prefix([1, 1]).last_device_node.backuped, "threshold 2 not reached"
    assert tree.evict(2) == 2
    assert tree.match_prefix([1, 1]).host_hit_length == 0, "deleted, not demoted"
    put(b, [3, 3])
    put(b, [3, 3])  # second hit: written
    settle(b)
    tree.check_hicache_events()
    tree.evict(2)
    free = b.host_pool.available_size()
    assert tree.evict_host(2) == 2 and b.host_pool.available_size() == free + 2
    tree.check_integrity()


def test_write_back_backs_up_only_on_eviction(bundles):
    b = bundles(hicache_write_policy="write_back")
    tree = b.tree_cache
    put(b, [1, 1])
    assert b.controller.ack_write_queue == [] and tree.protected_size() == 0
    tree.evict(2)
    assert tree.match_prefix([1, 1]).host_hit_length == 2
    tree.check_integrity()


def test_host_alloc_fail_local_returns_zero_silently(bundles):
    hooks = Hooks()
    hooks.register("host_alloc", lambda value, ctx: False)
    b = bundles("host-alloc=local", hooks=hooks)
    put(b, [1, 1])
    stats = b.tree_cache.probe_stats()
    assert stats["write_backs"] == 0 and stats["host_alloc_failed"] == 1
    assert not b.tree_cache.match_prefix([1, 1]).last_device_node.backuped


def vote(*flags: int) -> list[int]:
    return [len(flags), -len(flags), *flags] + [0] * (32 - len(flags))


def test_host_alloc_two_phase_votes_later_and_aborts_everywhere(bundles):
    comm = FakeComm(pp_size=1, peers=[vote(0)])  # the peer could not reserve
    b = bundles("host-alloc=two-phase", "host-capacity=local", comm=comm)
    tree = b.tree_cache
    free = b.host_pool.available_size()
    put(b, [1, 1])
    assert "all_reduce_pp" not in comm.names(), "no collective at ④ (PP1 waits for our proxy)"
    assert tree.protected_size() == 2 and b.controller.ack_write_queue == []
    tree.check_hicache_events()  # issues the vote with our reservation
    assert b.host_pool.available_size() == free - 2 and tree.protected_size() == 2
    assert [c for c in comm.calls if c[0] == "all_reduce_pp"] == [("all_reduce_pp", vote(1), "min")]
    tree.check_hicache_events()  # vote_delay later: applied
    assert b.host_pool.available_size() == free, "the reservation was rolled back"
    assert tree.protected_size() == 0
    stats = tree.probe_stats()
    assert stats["sync_received"]["host_alloc"] == [0]
    assert stats["write_backs"] == 0 and stats["host_alloc_failed"] == 1
    put(b, [1, 1])  # hit again: retried, and this time every rank agrees
    tree.check_hicache_events()
    tree.check_hicache_events()
    stats = tree.probe_stats()
    # The agreed write starts inside this ①; the copy thread may finish it before the same ①'s
    # writing_check polls, so its one ack is either still queued or already consumed.
    pending = len(b.controller.ack_write_queue)
    assert stats["write_backs"] == 2 and pending + stats["acks_consumed"]["write"] == 1
    tree.check_integrity()


def test_two_phase_surplus_entries_abort_on_the_longer_rank(bundles):
    comm = FakeComm(pp_size=1, peers=[vote(1)])  # the peer queued one node, we queue two
    b = bundles("host-alloc=two-phase", "host-capacity=local", comm=comm)
    put(b, [1, 1])
    put(b, [2, 2])
    b.tree_cache.check_hicache_events()
    sent = [c[1] for c in comm.calls if c[0] == "all_reduce_pp"]
    assert sent == [vote(1, 1)], "fixed width: shapes match whatever the counts"
    b.tree_cache.check_hicache_events()
    stats = b.tree_cache.probe_stats()
    assert stats["write_backs"] == 2 and stats["host_alloc_failed"] == 1
    assert stats["sync_received"]["host_alloc"] == [1, 0]
    b.tree_cache.check_integrity()


def test_host_capacity_min_syncs_at_build(bundles):
    comm = FakeComm(pp_size=1, peers=[8])
    b = bundles("host-capacity=min", comm=comm)
    assert b.host_pool.size == 8 and comm.calls[0][0] == "all_reduce_pp"
    assert b.tree_cache.probe_stats()["sync_received"]["host_capacity"] == 8
    b2 = bundles("host-capacity=local", comm=FakeComm(pp_size=1, peers=[8]))
    assert b2.host_pool.size == 32


def test_lru_clock_modes(bundles):
    hooks = Hooks()
    hooks.register("now", lambda value, ctx: 1000.0)
    mono = bundles("lru-clock=monotonic", hooks=hooks)
    put(mono, [1, 1])
    assert mono.tree_cache.probe_stats()["clock"] == 1000.0, "monotonic goes through the now hook"
    logical = bundles("lru-clock=logical", hooks=hooks)
    put(logical, [1, 1])
    first = logical.tree_cache.probe_stats()["clock"]
    logical.tree_cache.match_prefix([1, 1])
    assert logical.tree_cache.probe_stats()["clock"] > first and first < 100


def test_write_back_two_phase_defers_eviction_to_the_vote(bundles):
    """Eviction at ② can neither vote nor run a collective (PP1 waits for our proxy), and PP0
    relaying its own alloc left a follower whose alloc failed unable to obey. So the victim is
    kept for the next ①'s vote: refused, the next eviction deletes it; agreed, it is demoted."""
    comm = FakeComm(pp_size=1)
    b = bundles("host-alloc=two-phase", hicache_write_policy="write_back", comm=comm)
    tree = b.tree_cache
    comm.calls.clear()  # the init-time capacity MIN is not part of this
    free = b.host_pool.available_size()
    put(b, [1, 1])
    assert tree.evict(2) == 0 and tree.protected_size() == 2, "kept, locked, until the vote"
    assert not {"all_reduce_pp", "pp_sync"} & set(comm.names()), "no collective at ②"
    comm.peers.append(vote(0))  # a peer could not reserve
    tree.check_hicache_events()
    tree.check_hicache_events()  # vote_delay later: refused on every rank
    assert b.host_pool.available_size() == free and tree.protected_size() == 0
    assert tree.evict(2) == 2 and tree.match_prefix([1, 1]).host_hit_length == 0, "deleted"
    stats = tree.probe_stats()
    assert stats["sync_received"]["host_alloc"] == [0] and stats["host_alloc_failed"] == 1
    put(b, [2, 2])
    assert tree.evict(2) == 0
    tree.check_hicache_events()
    tree.check_hicache_events()  # agreed: the copy starts
    settle(b)
    tree.check_hicache_events()  # its write ack is consumed: unlocked, backed up
    assert tree.evict(2) == 2 and tree.match_prefix([2, 2]).host_hit_length == 2, "demoted"
    tree.check_integrity()
