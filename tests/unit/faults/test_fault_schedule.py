"""Seeded schedules: window, every, p, and the same seed giving the same firing steps."""

import threading

from hicache_diag.faults import parse_fault_spec

STEPS = range(200)


def _schedule(text, run_seed=0, index=0, rank=1):
    fault = parse_fault_spec(text).build()
    return fault.schedule(run_seed=run_seed, index=index, rank=rank)


def test_window_is_inclusive_at_both_ends():
    assert _schedule("rank-stall:ms=1,after=5,until=8").preview(STEPS) == [5, 6, 7, 8]
    assert _schedule("rank-stall:ms=1,after=5,until=5").preview(STEPS) == [5]
    assert _schedule("rank-stall:ms=1,after=198").preview(STEPS) == [198, 199]


def test_every_counts_opportunities_inside_the_window_from_the_first():
    assert _schedule("rank-stall:ms=1,every=10,after=20,until=60").preview(STEPS) == [
        20,
        30,
        40,
        50,
        60,
    ]


def test_every_counts_opportunities_not_steps():
    # Three allocs in step 0 and three in step 1: every second alloc fails.
    sched = _schedule("host-alloc-fail:every=2")
    assert [sched.fires(s) for s in (0, 0, 0, 1, 1, 1)] == [True, False, True, False, True, False]


def test_p_is_honoured_roughly():
    fired = _schedule("host-alloc-fail:p=0.25").preview(range(4000))
    assert 800 < len(fired) < 1200, len(fired)
    assert _schedule("host-alloc-fail:p=0").preview(STEPS) == []
    assert _schedule("host-alloc-fail:p=1").preview(STEPS) == list(STEPS)


def test_same_seed_same_schedule():
    a = _schedule("host-alloc-fail:p=0.3", run_seed=7).preview(STEPS)
    b = _schedule("host-alloc-fail:p=0.3", run_seed=7).preview(STEPS)
    assert a == b and 0 < len(a) < len(STEPS)


def test_each_seed_source_changes_the_schedule():
    base = _schedule("host-alloc-fail:p=0.3", run_seed=7).preview(STEPS)
    assert _schedule("host-alloc-fail:p=0.3", run_seed=8).preview(STEPS) != base
    assert _schedule("host-alloc-fail:p=0.3,seed=1", run_seed=7).preview(STEPS) != base
    assert _schedule("host-alloc-fail:p=0.3", run_seed=7, index=1).preview(STEPS) != base
    assert _schedule("host-alloc-fail:p=0.3", run_seed=7, rank=0).preview(STEPS) != base


def test_preview_is_pure_and_matches_live_firing():
    sched = _schedule("host-alloc-fail:p=0.5", run_seed=3)
    planned = sched.preview(STEPS)
    assert sched.preview(STEPS) == planned
    assert [s for s in STEPS if sched.fires(s)] == planned
    assert sched.seen == len(STEPS)


def test_magnitudes_do_not_shift_firing():
    a = _schedule("dma-delay:ms=1,p=0.5", run_seed=3)
    b = _schedule("dma-delay:ms=1,p=0.5", run_seed=3)
    fired_a = [s for s in STEPS if a.fires(s)]
    fired_b = []
    for s in STEPS:
        if b.fires(s):
            fired_b.append(s)
            b.uniform(0.0, 5.0)  # a jitter draw between opportunities
    assert fired_a == fired_b


def test_forks_are_independent_and_deterministic():
    sched = _schedule("l3-partial-hit:keep=0.5,p=0.5", run_seed=1)
    reads, exists = sched.fork("read"), sched.fork("exists")
    assert reads.preview(STEPS) != exists.preview(STEPS)
    assert reads.preview(STEPS) == sched.fork("read").preview(STEPS)


def test_counter_is_consistent_across_threads():
    sched = _schedule("host-alloc-fail:every=4")
    results = []

    def worker():
        results.extend(sched.fires(0) for _ in range(1000))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sched.seen == 4000 and sum(results) == 1000
