"""HiRadixCache + L3: backup after write-through, prefetch into the host tree, load-back of the
fetched pages, stop policies and PP0's relayed stop decisions. Real storage threads and page
files; the comm is the recording fake (one stage, or a follower fed PP0's relay)."""

from __future__ import annotations

import os
import time

import pytest
import torch
from hicache_helpers import PAGE, FakeComm, make_bundle, put, settle

from hicache_diag.engines.builtin.runtime.mem_cache.hicache_storage import get_page_hashes
from hicache_diag.faults.hooks import Hooks

TOKENS = list(range(10, 26))  # 8 pages of PAGE=2


@pytest.fixture
def bundles(tmp_path):
    made = []

    def factory(*fixes, policy="wait_complete", comm=None, **kw):
        b = make_bundle(
            *fixes,
            comm=comm,
            hicache_storage_backend="file",
            hicache_storage_dir=str(tmp_path / "l3"),
            hicache_storage_prefetch_policy=policy,
            **kw,
        )
        made.append(b)
        return b

    yield factory
    for b in made:
        b.shutdown()
    assert not [t for t in __import__("threading").enumerate() if t.name.startswith("hicache-")]


def wait_for(cond, timeout=5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out waiting for the storage threads"
        time.sleep(0.01)


def host_pages(b, key) -> list[list[float]]:
    node = b.tree_cache.root_node.children[tuple(key[:PAGE])]
    assert node.key == key and node.backuped
    pages = node.host_value.split(PAGE)
    return [b.storage.host_pages.get_page(p).tolist() for p in pages]


def backed_up(b, key) -> None:
    """Insert `key` (device K/V random), consume its write ack and its storage backup ack."""
    gen = torch.Generator().manual_seed(7)
    for buf in b.kv_pool.k_buffer + b.kv_pool.v_buffer:
        buf.copy_(torch.rand(buf.shape, generator=gen))
    put(b, key)
    settle(b)
    b.tree_cache.check_hicache_events()
    wait_for(lambda: b.storage.ack_backup_queue.qsize() > 0)
    b.tree_cache.check_hicache_events()


def test_write_through_ack_backs_the_node_up_to_l3_and_releases_it(bundles, tmp_path):
    b = bundles()
    backed_up(b, TOKENS)
    names = sorted(os.listdir(tmp_path / "l3"))
    hashes = get_page_hashes(TOKENS, PAGE)
    assert names == sorted(f"{h}_tiny-llama_0_1.bin" for h in hashes), "one file per page"
    assert b.tree_cache.ongoing_backup == {}, "the backup ack was drained"
    node = b.tree_cache.root_node.children[tuple(TOKENS[:PAGE])]
    assert node.host_ref_counter == 0, "host protection released after the backup ack"


def test_prefetch_inserts_fetched_pages_and_the_next_match_loads_them_back(bundles):
    warm = bundles()
    backed_up(warm, TOKENS)
    warm.shutdown()
    b = bundles()  # a fresh rank over the same directory: a warm start
    tree = b.tree_cache
    assert tree.prefetch_from_storage("r1", TOKENS)
    assert not tree.check_prefetch_progress("r1"), "wait_complete: not before the reads"
    wait_for(
        lambda: (
            (tree.check_hicache_events(), "r1" not in tree.ongoing_prefetch)[1]
            or tree.check_prefetch_progress("r1")
        )
    )
    stats = tree.probe_stats()
    assert tree.match_prefix(TOKENS).host_hit_length == len(TOKENS)
    assert stats["l3_hit_len"] == {"r1": 16} and stats["l3_hit_len_local"] == {"r1": 16}
    assert stats["l3_inserted"] == 16
    tree.check_integrity()
    fetched = host_pages(b, TOKENS)
    assert fetched == host_pages(warm, TOKENS), "L3 brought back the same K/V"
    assert any(v != 0 for page in fetched for v in page)


def test_prefetch_is_skipped_under_the_threshold_and_for_stored_nothing(bundles):
    b = bundles()
    assert not b.tree_cache.prefetch_from_storage("short", TOKENS[:PAGE])
    assert b.tree_cache.prefetch_from_storage("cold", TOKENS)
    wait_for(lambda: b.storage.prefetch_hit_queue.qsize() == 1)
    b.tree_cache.check_hicache_events()
    assert "cold" not in b.tree_cache.ongoing_prefetch, "a miss is revoked at once"
    assert b.storage.prefetch_tokens_occupied == 0
    assert b.tree_cache.check_prefetch_progress("cold")


def test_best_effort_stops_at_the_first_look_and_frees_its_reservation(bundles):
    b = bundles(policy="best_effort")
    tree = b.tree_cache
    assert tree.prefetch_from_storage("r1", TOKENS)
    tree.check_hicache_events()  # ①: PP0 decides (full protocol relays the decision)
    assert tree.check_prefetch_progress("r1")
    assert tree.ongoing_prefetch == {} and b.storage.prefetch_tokens_occupied == 0
    assert tree.root_node.host_ref_counter == 0, "the anchor is unprotected again"


def test_follower_obeys_pp0s_relayed_stop_decision(bundles):
    comm = FakeComm(pp_rank=1, pp_size=2)
    b = bundles("ack-count=leader", comm=comm)
    tree = b.tree_cache
    numel = b.storage.host_pages.page_numel()
    for h in get_page_hashes(TOKENS, PAGE):  # this stage's pages (suffix _2_1) are stored
        assert b.storage.storage.set(h, torch.ones(numel))
    assert tree.prefetch_from_storage("r1", TOKENS)
    wait_for(lambda: b.storage.prefetch_hit_queue.qsize() == 1)
    # relays in ① order: write count, load count, storage counts, then the stop flags
    comm.relay += [[0], [0], [1, 0, 0, 0], [1, 0] + [0] * 31]
    tree.check_hicache_events()
    assert not tree.check_prefetch_progress("r1"), "PP0 said not yet"
    comm.relay += [[0], [0], [0, 0, 0, 0], [1, 1] + [0] * 31]
    tree.check_hicache_events()
    assert tree.check_prefetch_progress("r1"), "PP0 said stop: the follower stops too"
    assert tree.probe_stats()["sync_received"]["l3_stop"] == [1]


def test_truncated_page_is_a_storage_fault_and_a_shorter_insert(bundles, tmp_path):
    warm = bundles()
    backed_up(warm, TOKENS)
    warm.shutdown()
    third = get_page_hashes(TOKENS, PAGE)[2]
    with open(tmp_path / "l3" / f"{third}_tiny-llama_0_1.bin", "r+b") as f:
        f.truncate(3)
    b = bundles()
    tree = b.tree_cache
    assert tree.prefetch_from_storage("r1", TOKENS)
    wait_for(lambda: (tree.check_hicache_events(), tree.check_prefetch_progress("r1"))[1])
    stats = tree.probe_stats()
    assert stats["l3_inserted"] == 2 * PAGE, "the pages before the truncated one"
    faults = stats["storage_faults"]
    assert faults and faults[0]["op"] == "read" and "short read" in faults[0]["reason"]
    tree.check_integrity()


# ---- host slots of the prefetch reads (host-alloc switch, l3_host_alloc) ---------------------

IDENTITY = 1 << 40  # a peer's MIN contribution that changes nothing
STOP_WIDTH = 33  # [n, flags x DECISION_WIDTH]


def l3_vote(*flags: int) -> list[int]:
    return [len(flags), -len(flags), *flags] + [0] * (16 - len(flags))


def l3_votes(comm: FakeComm) -> list[list[int]]:
    """The prefetch votes sent (the write_backup vote is 34 wide, this one 18)."""
    return [c[1] for c in comm.calls if c[0] == "all_reduce_pp" and len(c[1]) == 18]


def failing_host_alloc() -> tuple[Hooks, list[bool]]:
    hooks, fail = Hooks(), [True]
    hooks.register("host_alloc", lambda ok, ctx: ok and not fail[0])
    return hooks, fail


def stage_pages(b) -> None:
    numel = b.storage.host_pages.page_numel()
    for h in get_page_hashes(TOKENS, PAGE):  # this stage's pages are stored
        assert b.storage.storage.set(h, torch.full((numel,), 3.0))


def follower_step(b, storage=(0, 0, 0, 0), stop: int = 0) -> None:
    """One ① on PP1: PP0 relays the write and load counts, the storage drain counts, and its
    stop flag for the one prefetch in flight."""
    b.tree_cache.comm.relay += [[0], [0], list(storage), [1, stop] + [0] * (STOP_WIDTH - 2)]
    b.tree_cache.check_hicache_events()


def test_two_phase_follower_whose_host_alloc_fails_waits_for_the_vote(bundles):
    """OPEN 1: PP1's alloc failed, PP0's did not. PP1 must not revoke alone (it would admit the
    request while PP0 waits for the reads); the vote decides for both, then the retry commits."""
    hooks, fail = failing_host_alloc()
    comm = FakeComm(pp_rank=1, pp_size=2)
    b = bundles("ack-count=leader", "host-alloc=two-phase", comm=comm, hooks=hooks)
    tree, free = b.tree_cache, b.host_pool.available_size()
    stage_pages(b)
    assert tree.prefetch_from_storage("r1", TOKENS)
    wait_for(lambda: b.storage.prefetch_hit_queue.qsize() == 1)
    follower_step(b, storage=(1, 0, 0, 0))  # ①1: the agreed hit; our reservation fails
    assert "r1" in tree.ongoing_prefetch, "not revoked on this rank alone"
    assert not tree.check_prefetch_progress("r1"), "the request waits, as on PP0"
    assert l3_votes(comm) == [l3_vote(0)]
    follower_step(b)
    follower_step(b)  # ①3: the ①1 vote is applied: abort everywhere, one more try
    stats = tree.probe_stats()
    assert stats["sync_received"]["prefetch_alloc"] == [0] and stats["host_alloc_failed"] == 1
    assert "r1" in tree.ongoing_prefetch and b.host_pool.available_size() == free
    fail[0] = False
    follower_step(b)  # ①4: the retry reserves
    assert l3_votes(comm)[-1] == l3_vote(1)
    assert tree.probe_stats()["host_free"] == free, "a reservation counts as free until decided"
    tree.check_integrity()
    follower_step(b)
    follower_step(b)  # ①6: committed, the reads start
    assert tree.probe_stats()["sync_received"]["prefetch_alloc"] == [1]
    wait_for(lambda: b.storage.ack_prefetch_queue.qsize() == 2)  # one batch, then completion
    follower_step(b, storage=(0, 2, 0, 0), stop=1)
    assert tree.check_prefetch_progress("r1"), "PP0 said stop: both stop with the pages in"
    assert tree.probe_stats()["l3_inserted"] == len(TOKENS)
    tree.check_integrity()


def test_two_phase_leader_aborts_when_a_peer_could_not_reserve(bundles):
    comm = FakeComm(pp_size=1)
    b = bundles("host-alloc=two-phase", comm=comm)
    tree, free = b.tree_cache, b.host_pool.available_size()
    stage_pages(b)
    comm.peers += [IDENTITY, l3_vote(0)]  # ①1: write_backup's vote, then the peer's "no"
    assert tree.prefetch_from_storage("r1", TOKENS)
    wait_for(lambda: b.storage.prefetch_hit_queue.qsize() == 1)
    tree.check_hicache_events()
    assert l3_votes(comm) == [l3_vote(1)], "we reserved and voted yes"
    assert b.host_pool.available_size() == free - len(TOKENS)
    tree.check_integrity()
    tree.check_hicache_events()  # ①2 applies ①1: the MIN says no
    assert b.host_pool.available_size() == free, "our reservation was rolled back"
    assert "r1" in tree.ongoing_prefetch and b.storage.prefetch_buffer.qsize() == 0
    wait_for(lambda: (tree.check_hicache_events(), tree.check_prefetch_progress("r1"))[1])
    stats = tree.probe_stats()
    assert stats["sync_received"]["prefetch_alloc"] == [0, 1], "aborted, then committed"
    assert stats["l3_inserted"] == len(TOKENS)
    tree.check_integrity()


def test_two_phase_revokes_everywhere_after_the_second_no(bundles):
    comm = FakeComm(pp_size=1)
    b = bundles("host-alloc=two-phase", comm=comm)
    tree = b.tree_cache
    stage_pages(b)
    comm.peers += [IDENTITY, l3_vote(0), IDENTITY, IDENTITY, IDENTITY, l3_vote(0)]
    assert tree.prefetch_from_storage("r1", TOKENS)
    wait_for(lambda: b.storage.prefetch_hit_queue.qsize() == 1)
    for _ in range(4):
        tree.check_hicache_events()
    assert "r1" not in tree.ongoing_prefetch and tree.check_prefetch_progress("r1")
    assert b.storage.prefetch_tokens_occupied == 0 and tree.root_node.host_ref_counter == 0
    stats = tree.probe_stats()
    assert stats["sync_received"]["prefetch_alloc"] == [0, 0]
    assert stats["host_alloc_failed"] == 2 and b.host_pool.available_size() == b.host_pool.size
    tree.check_integrity()


def test_legacy_host_alloc_revokes_on_the_failing_rank_alone(bundles):
    """host-alloc=local keeps the per-rank decision: the divergence stays reproducible."""
    hooks, _ = failing_host_alloc()
    comm = FakeComm(pp_rank=1, pp_size=2)
    b = bundles("ack-count=leader", "host-alloc=local", comm=comm, hooks=hooks)
    tree = b.tree_cache
    stage_pages(b)
    assert tree.prefetch_from_storage("r1", TOKENS)
    wait_for(lambda: b.storage.prefetch_hit_queue.qsize() == 1)
    follower_step(b, storage=(1, 0, 0, 0))  # PP0 got its slots and says "not yet"
    assert "r1" not in tree.ongoing_prefetch and tree.check_prefetch_progress("r1")
    assert l3_votes(comm) == [] and tree.probe_stats()["host_alloc_failed"] == 1
