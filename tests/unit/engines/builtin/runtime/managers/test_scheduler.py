"""The scheduler in one process (PP1, a no-op comm) over the real cache tiers and model."""

from __future__ import annotations

import json

import pytest
import torch

from hicache_diag.engines.builtin.probes.recorder import RankRecorder
from hicache_diag.engines.builtin.reference import compute_reference
from hicache_diag.engines.builtin.runtime.managers.scheduler import Scheduler
from hicache_diag.engines.builtin.runtime.mem_cache.kv_cache_builder import build_kv_cache
from hicache_diag.engines.builtin.runtime.protocol import build_protocol
from hicache_diag.engines.builtin.runtime.server_args import RunConfig, ServerArgs, WorkloadConfig
from hicache_diag.faults.hooks import Hooks
from hicache_diag.options.workloads import Workload
from hicache_diag.trials.reference import compare_outputs


class SoloComm:
    """PP1 TP1: nothing to send; the HiCacheComm collectives are identities."""

    pp_rank, pp_size, tp_rank, tp_size = 0, 1, 0, 1
    is_first_rank = is_last_rank = True

    def all_reduce_tp(self, t, op="min"): ...
    def all_reduce_pp(self, t, op="min"): ...
    def pp_sync(self, t): ...
    def drain_async_work(self): ...
    def all_reduce_thread_group(self, name, t, op="min"): ...
    def inflight_sends(self):
        return 0

    def tp_all_reduce_sum(self, t):
        return t


def _run(tmp_path, hicache: bool, max_total_tokens: int, requests: int = 24):
    torch.set_num_threads(1)
    sa = ServerArgs(pp_size=1, max_total_tokens=max_total_tokens, enable_hierarchical_cache=hicache)
    cfg = RunConfig(
        server_args=sa,
        protocol=build_protocol("full"),
        workload=WorkloadConfig(requests=requests, seed=3),
    )
    hooks, comm = Hooks(), SoloComm()
    bundle = build_kv_cache(sa, cfg.protocol, comm, hooks, 0, 0)
    recorder = RankRecorder(tmp_path / "rank0.jsonl", 0, 0, 0, protocol=cfg.protocol)
    wl = Workload(cfg.workload, sa)
    sched = Scheduler(cfg, comm, bundle, hooks, recorder, wl.arrivals, wl.last_arrival_step)
    try:
        sched.event_loop_pp()
    finally:
        recorder.close()
        bundle.shutdown()
    recs = [json.loads(line) for line in (tmp_path / "rank0.jsonl").read_text().splitlines()]
    return sched, bundle, wl, recs


@pytest.mark.parametrize("hicache", [False, True])
def test_outputs_match_the_no_cache_reference(tmp_path, hicache):
    sched, bundle, wl, recs = _run(tmp_path, hicache, max_total_tokens=1024)
    ref = compute_reference(ServerArgs().model, wl.requests)
    assert compare_outputs(sched.finished_outputs, ref) == []
    assert sum(sum(r["prefix_len"].values()) for r in recs) > 0, "shared prefixes must hit"
    assert [r["step"] for r in recs] == list(range(len(recs))), "one line per step"
    bundle.tree_cache.check_integrity()


def test_eviction_under_pressure_keeps_outputs_right(tmp_path):
    sched, bundle, wl, recs = _run(tmp_path, False, max_total_tokens=256, requests=16)
    assert sum(r["evicted"] for r in recs) > 0, "a small pool must evict"
    ref = compute_reference(ServerArgs().model, wl.requests)
    assert compare_outputs(sched.finished_outputs, ref) == []
    # every slot is back: nothing leaked once all requests finished
    tree = bundle.tree_cache
    assert bundle.allocator.available_size() + tree.total_size() == 256
    assert tree.protected_size() == 0


def test_record_has_the_evidence_keys(tmp_path):
    *_, recs = _run(tmp_path, True, max_total_tokens=1024, requests=3)
    keys = {
        "step",
        "slot",
        "rids",
        "extend_num_tokens",
        "prefix_len",
        "host_hit_len",
        "l3_hit_len",
        "queues",
        "acks_ready",
        "acks_consumed",
        "sync_received",
        "host_free",
        "device_free",
        "evicted",
        "load_backs",
        "write_backs",
        "inflight_sends",
        "clock",
        "tree_digest",
        "faults_fired",
        "must_agree",
        "t",
        "forward_mode",
    }
    assert keys <= set(recs[0])
    assert any(r["forward_mode"] == "decode" for r in recs)
    assert any(r["forward_mode"] == "extend" for r in recs)


def test_empty_slot_records_nothing_launched(tmp_path):
    *_, recs = _run(tmp_path, False, max_total_tokens=1024, requests=1)
    idle = [r for r in recs if not r["rids"]]
    assert idle and all(r["extend_num_tokens"] == 0 and r["forward_mode"] is None for r in idle)
