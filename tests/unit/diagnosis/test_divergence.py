import pandas as pd
import pytest

from hicache_diag.diagnosis.divergence import first_divergence
from hicache_diag.evidence.verdict import DivergenceSource

from .builder import MUST_AGREE, step_record


def frames(world=2, steps=8, over=None):
    over = over or {}
    rows = [step_record(r, s, **over.get((r, s), {})) for s in range(steps) for r in range(world)]
    return pd.DataFrame(rows)


def test_no_divergence():
    assert first_divergence(frames()) is None


def test_first_step_and_field_win_over_later_ones():
    d = first_divergence(frames(over={(1, 3): {"evicted": 4}, (1, 5): {"rids": ["x"]}}))
    assert (d.first.step, d.first.field, d.first.values) == (3, "evicted", {"0": 0, "1": 4})


def test_only_must_agree_fields_count():
    d = first_divergence(frames(over={(1, 2): {"clock": 99.0, "queues": {"write_queue": 3}}}))
    assert d is None


def test_dma_ack_count_local_mode_names_the_slow_rank():
    slow = {"acks_ready": {"write": 0, "load": 0}, "acks_consumed": {"write": 0, "load": 0}}
    d = first_divergence(frames(over={(1, 4): slow}))
    assert d.first.field == "acks_consumed"
    assert d.first.source is DivergenceSource.DMA_ACK_COUNT
    assert d.culprit_rank == 1


def test_dma_ack_count_when_the_relayed_count_differs():
    over = {(r, s): {"sync_received": {"ack_count": [1, 0]}} for r in (0, 1) for s in range(8)}
    over[(1, 2)] = {"sync_received": {"ack_count": [0, 0]}}
    over[(1, 3)] = {"write_backs": 0, "sync_received": {"ack_count": [1, 0]}}
    d = first_divergence(frames(over=over))
    assert d.first.field == "write_backs"
    assert d.first.source is DivergenceSource.DMA_ACK_COUNT


def test_host_alloc_failure_just_before_on_one_rank():
    d = first_divergence(
        frames(over={(1, 2): {"host_alloc_failed": 1}, (1, 3): {"tree_digest": "other"}})
    )
    assert d.first.source is DivergenceSource.HOST_ALLOC and d.culprit_rank == 1


def test_host_alloc_failure_on_every_rank_is_not_the_source():
    over = {(r, 2): {"host_alloc_failed": 1} for r in (0, 1)}
    over[(1, 3)] = {"tree_digest": "other"}
    assert first_divergence(frames(over=over)).first.source is DivergenceSource.UNKNOWN


def test_lru_clock_different_victims_from_identical_trees():
    over = {
        (0, 5): {"evict_victims": ["a"], "evicted": 4, "clock": 5.0},
        (1, 5): {"evict_victims": ["b"], "evicted": 4, "clock": 9.0, "tree_digest": "t1"},
        (0, 6): {"tree_digest": "t0"},
        (1, 6): {"tree_digest": "t1"},
    }
    d = first_divergence(frames(over=over))
    assert (d.first.step, d.first.field) == (5, "tree_digest")
    assert d.first.source is DivergenceSource.LRU_CLOCK
    assert d.culprit_rank == 1


def test_victims_after_trees_already_differed_are_not_lru():
    over = {
        (1, 4): {"tree_digest": "x"},
        (0, 5): {"evict_victims": ["a"]},
        (1, 5): {"evict_victims": ["b"]},
    }
    d = first_divergence(frames(over=over))
    assert d.first.step == 4 and d.first.source is DivergenceSource.UNKNOWN


def test_l3_hit_local_lengths_differ():
    over = {
        (0, 3): {"l3_hit_len_local": {"r3": 64}, "l3_hit_len": {"r3": 64}},
        (1, 3): {"l3_hit_len_local": {"r3": 32}, "l3_hit_len": {"r3": 32}, "extend_num_tokens": 48},
    }
    d = first_divergence(frames(over=over))
    assert d.first.source is DivergenceSource.L3_HIT and d.culprit_rank == 1


def test_l3_hit_with_consensus_is_not_the_source():
    over = {
        (0, 3): {"l3_hit_len_local": {"r3": 64}, "l3_hit_len": {"r3": 32}},
        (1, 3): {"l3_hit_len_local": {"r3": 32}, "l3_hit_len": {"r3": 32}},
        (1, 4): {"evicted": 8},
    }
    assert first_divergence(frames(over=over)).first.source is DivergenceSource.UNKNOWN


def test_l3_progress_differs():
    over = {
        (0, 2): {"sync_received": {"l3_progress": 128}},
        (1, 2): {"sync_received": {"l3_progress": 64}},
        (1, 3): {"host_hit_len": {"r3": 4}},
    }
    d = first_divergence(frames(over=over))
    assert d.first.source is DivergenceSource.L3_PROGRESS


def test_minority_rank_is_culprit_with_three_ranks():
    d = first_divergence(frames(world=3, over={(2, 1): {"evicted": 8}}))
    assert d.culprit_rank == 2 and d.first.values == {"0": 0, "1": 0, "2": 8}


def test_a_rank_that_stopped_early_is_not_a_divergence():
    f = frames()
    f = f[~((f["rank"] == 1) & (f["step"] > 4))]
    assert first_divergence(f) is None


def test_within_a_step_the_cause_is_reported_before_its_effects():
    over = {
        (1, 4): {
            "rids": ["a", "b"],
            "extend_num_tokens": 9,
            "acks_ready": {"write": 3, "load": 0},
            "acks_consumed": {"write": 3, "load": 0},
        }
    }
    d = first_divergence(frames(over=over))
    assert (d.first.step, d.first.field) == (4, "acks_consumed")
    assert d.first.source is DivergenceSource.DMA_ACK_COUNT


# ---- issue 14: attribution from evidence only ------------------------------------------------


def test_faults_fired_never_chooses_the_culprit():
    """Two equal camps of ready acks: the rank with fewer ready acks is the culprit, whichever
    rank the injection records say was perturbed."""
    slow = {"acks_ready": {"write": 0, "load": 0}, "acks_consumed": {"write": 0, "load": 0}}
    fired = {"faults_fired": [{"fault": "dma-delay", "step": 4}]}
    d = first_divergence(frames(over={(1, 4): slow, (0, 4): fired}))
    assert d.culprit_rank == 1
    d_blind = first_divergence(frames(over={(1, 4): slow}))
    assert d_blind.culprit_rank == d.culprit_rank


def test_host_pool_refusal_hidden_by_a_retry_is_the_host_alloc_source():
    # write_backup's evict_host + retry succeeded, so host_alloc_failed stayed 0 on rank 1,
    # but only rank 1's pool refused and evicted: its tree differs two steps later.
    over = {(r, s): {"host_pool_refused": 0} for r in (0, 1) for s in range(8)}
    over[(1, 2)] = {"host_pool_refused": 2}
    over[(1, 4)] = {"host_pool_refused": 0, "tree_digest": "other"}
    d = first_divergence(frames(over=over))
    assert d.first.source is DivergenceSource.HOST_ALLOC and d.culprit_rank == 1


def test_pool_refusals_under_a_vote_are_not_the_source():
    over = {(r, s): {"sync_received": {"host_alloc": [1]}} for r in (0, 1) for s in range(8)}
    over[(1, 2)] = {"host_pool_refused": 2, "sync_received": {"host_alloc": [0]}}
    over[(1, 4)] = {"tree_digest": "other", "sync_received": {"host_alloc": [1]}}
    assert first_divergence(frames(over=over)).first.source is not DivergenceSource.HOST_ALLOC


def test_lru_culprit_is_the_rank_whose_clock_went_back_even_with_the_smaller_clock():
    over = {
        (0, 2): {"clock_regressions": 3},
        (0, 5): {"evict_victims": ["a"], "evicted": 4, "clock": 5.0},
        (1, 5): {"evict_victims": ["b"], "evicted": 4, "clock": 9.0, "tree_digest": "t1"},
    }
    d = first_divergence(frames(over=over))
    assert d.first.source is DivergenceSource.LRU_CLOCK and d.culprit_rank == 0


def test_l3_progress_culprit_from_own_reads_when_tp_reduced_values_tie():
    # PP2 x TP2: rank 2's holes made stage 1's TP-reduced progress short on ranks 2 and 3.
    over = {
        (r, 3): {
            "l3_progress": {"r3": 64 if r < 2 else 32},
            "l3_progress_local": {"r3": 32 if r == 2 else 64},
        }
        for r in range(4)
    }
    over[(3, 4)] = {"host_hit_len": {"r4": 4}}
    d = first_divergence(frames(world=4, over=over))
    assert d.first.source is DivergenceSource.L3_PROGRESS and d.culprit_rank == 2


def test_an_input_older_than_the_lookback_still_explains_the_divergence():
    over = {
        (0, 1): {"l3_progress": {"r1": 64}},
        (1, 1): {"l3_progress": {"r1": 16}, "l3_progress_local": {"r1": 16}},
        (1, 14): {"host_hit_len": {"r14": 4}},
    }
    d = first_divergence(frames(steps=16, over=over))
    assert d.first.step == 14 and d.first.source is DivergenceSource.L3_PROGRESS
    assert d.culprit_rank == 1


def test_divergence_modules_never_read_faults_fired():
    import inspect

    from hicache_diag.diagnosis import (
        attribution,
        divergence,
        divergence_values,
        host_attribution,
    )

    for module in (divergence, attribution, host_attribution, divergence_values):
        source = inspect.getsource(module).replace("(`faults_fired` is the injection", "")
        assert "faults_fired" not in source, module.__name__


def test_dma_culprit_is_the_rank_with_the_old_pending_ack_not_the_one_that_polled_early():
    # Rank 0 polled before its copies were issued (0 ready); rank 1's copies were issued
    # earlier but its copy engine is slow: its first pending ack is 40 ms old a step later.
    over = {
        (0, 4): {
            "acks_ready": {"write": 0, "load": 0},
            "acks_consumed": {"write": 0, "load": 0},
            "ack_pending_ms": {"write": 0.4},
        },
        (1, 4): {"ack_pending_ms": {"write": 3.0}},
        (1, 5): {"ack_pending_ms": {"write": 41.0}},
    }
    d = first_divergence(frames(over=over))
    assert d.first.source is DivergenceSource.DMA_ACK_COUNT and d.culprit_rank == 1
    assert "oldest pending ack" in d.evidence[1]


def test_close_pending_ages_fall_back_to_fewer_ready_acks():
    over = {
        (1, 4): {
            "acks_ready": {"write": 0, "load": 0},
            "acks_consumed": {"write": 0, "load": 0},
            "ack_pending_ms": {"write": 4.0},
        },
        (0, 4): {"ack_pending_ms": {"write": 3.0}},
    }
    assert first_divergence(frames(over=over)).culprit_rank == 1


def test_l3_hit_matched_by_request_when_stages_look_up_at_different_steps():
    # From a legacy l3_divergence run: PP1 (the faulted rank, keep=0.5) looked r4 up at
    # step 3, PP0 one step later with the full length. Step-aligned, PP0 holds "no lookup".
    agree = [*MUST_AGREE, "l3_hit_len"]
    over = {(r, s): {"must_agree": agree} for r in (0, 1) for s in range(8)}
    over[(1, 3)].update(l3_hit_len_local={"r4": 24}, l3_hit_len={"r4": 24})
    over[(0, 4)].update(l3_hit_len_local={"r4": 48}, l3_hit_len={"r4": 48})
    d = first_divergence(frames(over=over))
    assert (d.first.step, d.first.field) == (3, "l3_hit_len")
    assert d.first.source is DivergenceSource.L3_HIT and d.culprit_rank == 1
    assert "r4 hit per rank {1: 24, 0: 48}" in d.evidence[1]


@pytest.mark.parametrize("first", [0, 1])
def test_l3_hit_drain_race_without_a_length_difference_names_the_stage_off_pp0(first):
    # Legacy: each stage drains its own prefetch_hit_queue; r0 (no pages anywhere) was drained
    # by one stage a step before the other. Nothing differs by request: the stage whose drain
    # left PP0's (the count the fixed protocol relays) is named, whichever drained first.
    agree = [*MUST_AGREE, "l3_hit_len"]
    over = {(r, s): {"must_agree": agree} for r in (0, 1) for s in range(8)}
    over[(first, 2)].update(l3_hit_len_local={"r0": 0}, l3_hit_len={"r0": 0})
    over[(1 - first, 3)].update(l3_hit_len_local={"r0": 0}, l3_hit_len={"r0": 0})
    d = first_divergence(frames(over=over))
    assert (d.first.step, d.first.source, d.culprit_rank) == (2, DivergenceSource.L3_HIT, 1)
    assert "drained different L3 hit queries at step 2" in d.evidence[1]


def test_acks_drained_per_rank_name_the_rank_that_drained_fewer_when_ready_reads_equal():
    # Real SGLang 0.5.12.post1 (each stage drains its own ready acks; the line reads the ready
    # count after the drain): PP0 drained 1 write ack at the step, PP1 (slow copies) none.
    after = {"acks_ready": {"write": 0, "load": 0}}
    over = {
        (0, 4): {**after, "acks_consumed": {"write": 1, "load": 0}},
        (1, 4): {**after, "acks_consumed": {"write": 0, "load": 0}},
    }
    d = first_divergence(frames(over=over))
    assert (d.first.field, d.first.source) == ("acks_consumed", DivergenceSource.DMA_ACK_COUNT)
    assert d.culprit_rank == 1


def test_device_slots_held_on_one_rank_name_it_not_the_tie_over_the_evictions():
    """A load-back that found rank 1's device pool short (slots held, `device_held`) made only
    rank 1 evict: the 1-1 tie over `evicted` would name rank 0 (the smaller value); rank 1's own
    record names it. The source stays `unknown`: a device shortage is no classic source."""
    over = {(1, 5): {"device_held": 60, "load_back_declined": 0, "evicted": 64}}
    d = first_divergence(frames(over=over))
    assert (d.first.step, d.first.field) == (5, "evicted")
    assert d.first.source is DivergenceSource.UNKNOWN and d.culprit_rank == 1
    assert "device slots were held" in d.evidence[1]
    d_even = first_divergence(frames(over={**over, (0, 5): {"device_held": 60}}))
    assert d_even.culprit_rank == 0  # held on every rank: no rank-local record, the tie decides
