"""The physical faults' parts: the side pool, host-shortage's target, the pass-through injectors'
refusals, and the evidence they leave for the divergence finder and the verdict."""

import threading
from collections import deque

import pandas as pd
import pytest
import torch

from hicache_diag.diagnosis.consensus import consensus_lines
from hicache_diag.diagnosis.divergence import attribute, find_first
from hicache_diag.engines.builtin.runtime.mem_cache.memory_pool_host import HostKVCache
from hicache_diag.engines.sglang.options import SglangOptions
from hicache_diag.evidence.verdict import DivergenceSource
from hicache_diag.faults import parse_fault_spec
from hicache_diag.faults.hooks import Hooks
from hicache_diag.faults.install import install_faults
from hicache_diag.faults.side_pool import SidePool
from hicache_diag.faults.validate import validated_faults


def _pool(size=64, page=4):
    return HostKVCache(size, page, layer_num=1, head_num=1, head_dim=2)


def test_side_pool_takes_slots_through_the_pools_own_alloc_and_gives_them_back():
    pool, side = _pool(), SidePool()
    assert side.settle(pool, 30) == 28  # whole pages only
    assert pool.available_size() == 36
    assert side.settle(pool, 1000) == 64 and pool.available_size() == 0  # never makes it fail
    assert pool.alloc(4) is None  # now SGLang's own shortage: a request above available_size
    side.settle(pool, 0)
    assert side.tokens == 0 and pool.available_size() == 64
    pool.check_integrity()


@pytest.mark.parametrize(
    ("keys", "free", "held", "step", "want"),
    [
        ("hold=16", 64, 0, 5, 16),
        ("leave=8", 40, 0, 5, 32),
        ("leave=8", 12, 32, 5, 36),  # grows as slots free up
        ("hold=16", 64, 16, 2, 0),  # before the window: nothing held
    ],
)
def test_host_shortage_asks_for_what_the_side_pool_should_hold(keys, free, held, step, want):
    hooks = Hooks(rank=1)
    spec = parse_fault_spec(f"host-shortage:rank=1,after=3,{keys}")
    install_faults(hooks, [spec], 0, rank=1, pp_rank=1, tp_rank=0)
    hooks.step = step
    assert hooks.apply("host_hold", held, held=held, free=free, capacity=64) == want


def test_the_builtin_pool_with_a_side_pool_makes_write_backup_short():
    hooks = Hooks(rank=1)
    install_faults(hooks, ["host-shortage:leave=0"], 0, rank=1, pp_rank=1, tp_rank=0)
    pool, side = _pool(), SidePool()
    assert side.hold(hooks, pool) == 64
    assert pool.available_size() == 0


def test_a_side_pool_forgets_its_slots_when_the_pool_is_cleared_under_it():
    # SGLang's flush_cache clears the host pool: the held slots are free again, so the side
    # pool must not count them as held too (free + held would exceed the capacity).
    hooks = Hooks(rank=1)
    install_faults(hooks, ["host-shortage:leave=0"], 0, rank=1, pp_rank=1, tp_rank=0)
    pool, side = _pool(), SidePool()
    assert side.hold(hooks, pool) == 64
    pool.free_pages = deque(range(pool.size // pool.page_size))  # what SGLang's clear() does
    pool._used.clear()
    assert side.hold(hooks, pool) == 64 and pool.available_size() == 0
    side.settle(pool, 0)  # gives back only what it holds now: no double free
    assert pool.available_size() == 64
    pool.check_integrity()


def _frames(rows):
    return pd.DataFrame(rows).sort_values(["step", "rank"]).reset_index(drop=True)


def test_a_held_side_pool_is_not_the_divergence_but_the_skipped_backup_is():
    agree = ["host_free", "write_backs"]
    rows = [
        {"step": 1, "rank": 0, "pp": 0, "host_free": 64, "write_backs": 0, "must_agree": agree},
        {
            "step": 1,
            "rank": 1,
            "pp": 1,
            "host_free": 0,
            "host_held": 64,
            "write_backs": 0,
            "must_agree": agree,
        },
        {"step": 2, "rank": 0, "pp": 0, "host_free": 56, "write_backs": 8, "must_agree": agree},
        {
            "step": 2,
            "rank": 1,
            "pp": 1,
            "host_free": 0,
            "host_held": 64,
            "write_backs": 0,
            "host_shortage": 1,
            "host_shortages": [{"need": 8, "free": 0, "evicted": 0, "evict_calls": 1}],
            "must_agree": agree,
        },
    ]
    frames = _frames(rows)
    step, column, values = find_first(frames)
    assert (step, column) == (2, "host_free")  # 56 vs 0 + 64 held: the trees now differ
    source, culprit, why = attribute(frames, step, column, values)
    assert source is DivergenceSource.HOST_ALLOC and culprit == 1
    assert "needed 8 tokens with 0 free; evict_host ran 1 time(s) and freed 0" in why


def test_sglang_injectors_pass_through_only_where_the_release_has_them():
    inj = parse_fault_spec("sglang-storage-injector:failure=0.1").build()
    assert "builtin engine has no such mechanism" in inj.BUILTIN_REFUSAL
    assert "0.5.23 added them" in inj.sglang_refusal("0.5.21")
    assert inj.sglang_refusal("0.5.23") is None
    # Before a release is probed the sglang engine refuses none: its probe asks per release.
    assert validated_faults(SglangOptions(faults=("sglang-storage-injector:failure=0.1",)))
    h2d = parse_fault_spec("sglang-h2d-delay:cycles=1000").build()
    if not torch.cuda.is_available():
        assert "no GPU" in h2d.sglang_refusal("0.5.23")


def test_the_consensus_checkers_report_becomes_one_evidence_line_per_rank():
    log = (
        "[2026-12-02 02:00:00 PP1 TP0] Found rank divergence for 2 events(s)! local hash: "
        "0123456789abcdef, events = ['insert r1 16', 'evict 8']\n"
    )
    lines = consensus_lines({0: "nothing\n", 1: log})
    assert len(lines) == 1
    assert "rank 1 (2 event(s), local hash 0123456789ab" in lines[0]
    assert "['insert r1 16', 'evict 8']" in lines[0]


def test_a_slow_link_delivers_late_in_order_without_stalling_the_sender():
    import time
    from types import SimpleNamespace

    from hicache_diag.faults import link_delay

    sent = []

    def real_isend(tensor, dst=None, tag=0):
        sent.append((tensor, tag, time.monotonic()))
        return SimpleNamespace(wait=lambda *a: True, is_completed=lambda: True)

    fake = SimpleNamespace(isend=real_isend, send=real_isend)
    hooks = Hooks(rank=0)
    install_faults(hooks, ["p2p-delay:ms=200,msg=sync"], 0, rank=0, pp_rank=0, tp_rank=0)
    link = link_delay.install(hooks, fake)
    t0 = time.monotonic()
    with link_delay.message("sync"):
        work = fake.isend("counts", dst=1, tag=7)
    with link_delay.message("reqs"):  # not delayed itself, but queued behind the relay: FIFO
        later = fake.isend("reqs", dst=1, tag=8)
    assert time.monotonic() - t0 < 0.1 and sent == []  # the sender went on
    work.wait()
    later.wait()
    assert [s[0] for s in sent] == ["counts", "reqs"]
    assert sent[0][2] - t0 >= 0.19
    assert [f["fault"] for f in hooks.drain_fired()] == ["p2p-delay"]
    fake.isend("plain", dst=1)  # outside any PP message, with the link idle: sent at once
    assert sent[-1][0] == "plain"
    link.close()
    assert not [t for t in threading.enumerate() if t.name == "hicache-link"]


def test_a_silent_ledger_shift_is_the_same_count_over_different_nodes():
    from hicache_diag.diagnosis.ledger import ledger_lines

    rows = [
        {"step": 5, "rank": 0, "write_acked_nodes": [3]},
        {"step": 5, "rank": 1, "write_acked_nodes": [3]},
        {"step": 9, "rank": 0, "write_acked_nodes": [7, 8]},
        {"step": 9, "rank": 1, "write_acked_nodes": [3, 4]},
    ]
    lines = ledger_lines(_frames(rows))
    assert len(lines) == 1 and "silent ledger shift at step 9" in lines[0]
    assert ledger_lines(_frames(rows[:2])) == []


def test_a_crash_record_keeps_the_shortages_of_the_step_it_died_in(tmp_path):
    import json

    from hicache_diag.engines.sglang.plugin.recorder import StepRecorder

    rec = StepRecorder(str(tmp_path / "rank1.jsonl"), 1, 1, 0, Hooks(rank=1, pp_rank=1))
    rec.begin_step()
    rec.host_held = 516
    rec.count("host_evict_calls", 1)
    rec.shortage(need=56, free=0, evicted=0, evict_calls=1)
    rec.write_crash(IndexError("pop from empty list"))
    rec.close()
    line = json.loads((tmp_path / "rank1.jsonl").read_text())
    assert line["crashed"] and line["host_shortage"] == 1 and line["host_held"] == 516
    assert line["host_shortages"] == [{"need": 56, "free": 0, "evicted": 0, "evict_calls": 1}]
