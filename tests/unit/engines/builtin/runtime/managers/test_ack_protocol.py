"""check_hicache_events under every L2 switch mode, against a fake HiCacheComm: what each rank
sends, what it receives, and what it consumes."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "mem_cache"))
from hicache_helpers import FakeComm, bundle_factory, put, settle  # noqa: E402

from hicache_diag.faults.hooks import Hooks  # noqa: E402


@pytest.fixture
def bundles():
    yield from bundle_factory("host-capacity=local")


def two_writes(b):
    put(b, [1, 1])
    put(b, [2, 2])
    settle(b)


def test_local_counts_own_ready_acks_without_pp_sync(bundles):
    comm = FakeComm(pp_rank=1)
    b = bundles("ack-count=local", "tp-collective=unconditional", comm=comm)
    two_writes(b)
    b.tree_cache.check_hicache_events()
    assert "pp_sync" not in comm.names()
    assert ("all_reduce_tp", [2], "min") in comm.calls, "local mode still MINs over TP"
    stats = b.tree_cache.probe_stats()
    assert stats["acks_ready"]["write"] == 2 and stats["acks_consumed"]["write"] == 2
    assert "ack_count" not in stats["sync_received"]


def test_leader_pp0_counts_and_relays_write_and_load_separately(bundles):
    comm = FakeComm(pp_rank=0)
    b = bundles("ack-count=leader", "tp-collective=unconditional", comm=comm)
    two_writes(b)
    b.tree_cache.check_hicache_events()
    syncs = [c for c in comm.calls if c[0] == "pp_sync"]
    assert syncs == [("pp_sync", [2]), ("pp_sync", [0])], "write count, then load count"
    assert comm.names().index("all_reduce_tp") < comm.names().index("pp_sync")
    assert b.tree_cache.probe_stats()["sync_received"]["ack_count"] == {"write": 2, "load": 0}


def test_leader_batched_sends_one_vector(bundles):
    comm = FakeComm(pp_rank=0)
    b = bundles("ack-count=leader-batched", comm=comm)
    two_writes(b)
    b.tree_cache.check_hicache_events()
    assert [c for c in comm.calls if c[0] == "pp_sync"] == [("pp_sync", [2, 0])]


def test_leader_follower_consumes_exactly_the_relayed_count(bundles):
    comm = FakeComm(pp_rank=1, relay=[[1, 0]])
    b = bundles("ack-count=leader-batched", comm=comm)
    two_writes(b)
    b.tree_cache.check_hicache_events()
    assert "all_reduce_tp" not in comm.names(), "followers do not run the TP MIN"
    stats = b.tree_cache.probe_stats()
    assert stats["acks_ready"]["write"] == 2 and stats["acks_consumed"]["write"] == 1
    assert len(b.controller.ack_write_queue) == 1


def test_follower_with_shorter_queue_pops_from_empty_list(bundles):
    comm = FakeComm(pp_rank=1, relay=[[3, 0]])
    b = bundles("ack-count=leader-batched", comm=comm)
    two_writes(b)
    with pytest.raises(IndexError, match="pop from empty list"):
        b.tree_cache.check_hicache_events()  # crash form B (#29109)


def test_ack_for_an_untracked_node_raises_keyerror(bundles):
    comm = FakeComm(pp_rank=1, relay=[[1, 0]])
    b = bundles("ack-count=leader-batched", comm=comm)
    put(b, [1, 1])
    settle(b)
    b.tree_cache.ongoing_write_through.clear()
    with pytest.raises(KeyError):
        b.tree_cache.check_hicache_events()


def test_follower_blocks_on_its_own_slower_dma(bundles):
    hooks = Hooks()
    hooks.register("dma_complete", lambda value, ctx: 0.3)
    comm = FakeComm(pp_rank=1, relay=[[1, 0]])
    b = bundles("ack-count=leader-batched", comm=comm, hooks=hooks)
    put(b, [1, 1])
    assert not b.controller.ack_write_queue[0].finish_event.query()
    t0 = time.monotonic()
    b.tree_cache.check_hicache_events()
    assert time.monotonic() - t0 >= 0.2, "synchronize() waited for the delayed copy"
    assert b.tree_cache.probe_stats()["acks_consumed"]["write"] == 1


def test_local_mode_leaves_not_ready_acks(bundles):
    hooks = Hooks()
    hooks.register("dma_complete", lambda value, ctx: 0.3)
    b = bundles("ack-count=local", comm=FakeComm(pp_rank=1), hooks=hooks)
    put(b, [1, 1])
    b.tree_cache.check_hicache_events()
    assert b.tree_cache.probe_stats()["acks_consumed"]["write"] == 0
    assert b.tree_cache.protected_size() == 2, "still locked: the divergence seed"


@pytest.mark.parametrize(("mode", "called"), [("conditional", False), ("unconditional", True)])
def test_tp_collective_on_empty_queue(bundles, mode, called):
    comm = FakeComm(pp_rank=0, tp_size=2)
    b = bundles("ack-count=local", f"tp-collective={mode}", comm=comm)
    b.tree_cache.check_hicache_events()
    assert ("all_reduce_tp" in comm.names()) is called
    assert b.tree_cache.probe_stats()["tp_allreduce_skipped"] == (0 if called else 2)


@pytest.mark.parametrize(("mode", "kept"), [("unbounded", 3), ("bounded", 1)])
def test_inflight_sends(bundles, mode, kept):
    comm = FakeComm(pp_rank=0)
    b = bundles("ack-count=leader-batched", f"inflight-sends={mode}", comm=comm)
    for _ in range(3):
        b.tree_cache.check_hicache_events()
    assert comm.inflight_sends() == kept
    assert ("drain_async_work" in comm.names()) is (mode == "bounded")
    if mode == "bounded":
        assert comm.names()[0] == "drain_async_work", "drain comes first"
    assert b.tree_cache.probe_stats()["inflight_sends"] == kept
