"""Each injector against a real Hooks object: what it changes, when, and what it records."""

import time

from hicache_diag.faults import install_faults
from hicache_diag.faults.hooks import Hooks


def _hooks(*specs, rank=1, seed=0):
    hooks = Hooks(rank=rank, pp_rank=rank, tp_rank=0)
    installed = install_faults(hooks, list(specs), seed, rank=rank, pp_rank=rank, tp_rank=0)
    return hooks, installed


def test_no_fault_leaves_every_point_alone():
    hooks, installed = _hooks()
    assert installed == []
    assert hooks.apply("dma_complete", 0.0, direction="write", num_tokens=4) == 0.0
    assert hooks.apply("host_alloc", True, num_tokens=4) is True
    assert hooks.apply("now", 12.5) == 12.5
    assert hooks.drain_fired() == []


def test_dma_delay_adds_ms_in_its_direction_only():
    hooks, _ = _hooks("dma-delay:rank=1,ms=40,dir=write")
    hooks.step = 3
    assert hooks.apply("dma_complete", 0.0, direction="write", num_tokens=8) == 0.04
    assert hooks.apply("dma_complete", 0.0, direction="load", num_tokens=8) == 0.0
    assert hooks.drain_fired() == [
        {"fault": "dma-delay", "step": 3, "direction": "write", "delay_ms": 40.0, "num_tokens": 8}
    ]


def test_dma_delay_jitter_is_bounded_and_seeded():
    def delays(seed):
        hooks, _ = _hooks("dma-delay:ms=10,jitter-ms=5", seed=seed)
        return [hooks.apply("dma_complete", 0.0, direction="load") for _ in range(50)]

    first = delays(1)
    assert all(0.010 <= d <= 0.015 for d in first) and len(set(first)) > 1
    assert delays(1) == first and delays(2) != first


def test_host_alloc_fail_fails_every_nth_and_records():
    hooks, _ = _hooks("host-alloc-fail:rank=1,every=2")
    got = [hooks.apply("host_alloc", True, num_tokens=4) for _ in range(4)]
    assert got == [False, True, False, True]
    fired = hooks.drain_fired()
    assert [f["fault"] for f in fired] == ["host-alloc-fail"] * 2
    assert fired[0]["num_tokens"] == 4


def test_host_alloc_fail_does_not_claim_a_failure_that_already_happened():
    hooks, _ = _hooks("host-alloc-fail")
    assert hooks.apply("host_alloc", False, num_tokens=4) is False
    assert hooks.drain_fired() == []


def test_clock_skew_offset_and_drift():
    hooks, _ = _hooks("clock-skew:offset-ms=100,drift-ppm=1000")
    assert abs(hooks.apply("now", 10.0) - 10.1) < 1e-9
    # 1000 ppm over 2 s after the first reading: +2 ms on top of the offset.
    assert abs(hooks.apply("now", 12.0) - (12.0 + 0.1 + 0.002)) < 1e-9


def test_clock_skew_jitter_can_reorder_stamps_and_records_once_per_step():
    hooks, _ = _hooks("clock-skew:jitter-us=500", seed=4)
    stamps = [hooks.apply("now", 1.0 + i * 1e-6) for i in range(100)]
    assert all(abs(s - (1.0 + i * 1e-6)) <= 500e-6 for i, s in enumerate(stamps))
    assert stamps != sorted(stamps)  # what changes LRU victims
    assert len(hooks.drain_fired()) == 1
    hooks.step = 1
    hooks.apply("now", 2.0)
    assert [f["step"] for f in hooks.drain_fired()] == [1]


def test_l3_partial_hit_keeps_a_fraction_of_leading_pages():
    hooks, _ = _hooks("l3-partial-hit:keep=0.5")
    assert hooks.apply("storage_exists", 8, num_pages=10) == 4
    assert hooks.apply("storage_exists", 1, num_pages=10) == 0
    assert hooks.apply("storage_exists", 0, num_pages=10) == 0
    fired = hooks.drain_fired()
    assert fired[0] == {
        "fault": "l3-partial-hit",
        "step": 0,
        "point": "storage_exists",
        "found": 8,
        "kept": 4,
    }
    assert len(fired) == 2  # 0 pages found: nothing to shorten, nothing recorded


def test_l3_partial_hit_holes_fail_reads_deterministically():
    def reads(seed):
        hooks, _ = _hooks("l3-partial-hit:holes=0.3", seed=seed)
        return [hooks.apply("storage_read", True, page_index=i, num_pages=40) for i in range(40)]

    first = reads(5)
    assert 0 < first.count(False) < 40
    assert reads(5) == first and reads(6) != first


def test_l3_partial_hit_slow_reads_sleep():
    hooks, _ = _hooks("l3-partial-hit:slow-ms=30")
    start = time.monotonic()
    assert hooks.apply("storage_read", True, page_index=0, num_pages=1) is True
    assert time.monotonic() - start >= 0.03
    assert hooks.drain_fired()[0]["slow_ms"] == 30.0


def test_p2p_delay_adds_to_every_send():
    hooks, _ = _hooks("p2p-delay:ms=25")
    assert hooks.apply("p2p_send", 0.0, msg="proxy") == 0.025
    assert hooks.drain_fired() == [
        {"fault": "p2p-delay", "step": 0, "msg": "proxy", "delay_ms": 25.0}
    ]


def test_rank_stall_returns_sleep_seconds_in_its_window():
    hooks, _ = _hooks("rank-stall:ms=200,after=2,until=3")
    got = []
    for step in range(5):
        hooks.step = step
        got.append(hooks.apply("scheduler_step", 0.0))
    assert got == [0.0, 0.0, 0.2, 0.2, 0.0]
    assert [f["step"] for f in hooks.drain_fired()] == [2, 3]


def test_faults_stack_on_one_point():
    hooks, installed = _hooks("p2p-delay:ms=10", "p2p-delay:ms=5")
    assert installed == ["p2p-delay", "p2p-delay"]
    assert abs(hooks.apply("p2p_send", 0.0, msg="sync") - 0.015) < 1e-12
