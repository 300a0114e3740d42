"""Harness pieces without processes: workload, reference tolerance, hang watch, run dir."""

from __future__ import annotations

import dataclasses
import json

import pytest

from hicache_diag.engines.builtin.manifest import config_from_dict, config_to_dict
from hicache_diag.engines.builtin.runtime.protocol import build_protocol
from hicache_diag.engines.builtin.runtime.server_args import RunConfig, ServerArgs, WorkloadConfig
from hicache_diag.errors import UsageError
from hicache_diag.options.workloads import Workload
from hicache_diag.trials.hang_watch import HangWatch
from hicache_diag.trials.reference import GAP_TOLERANCE, compare_outputs
from hicache_diag.trials.rundir import check_writable, prepare_run_dir


@pytest.mark.parametrize("kind", ["shared-prefix", "random", "long-prompt", "idle"])
def test_workload_is_a_pure_function_of_its_seed(kind):
    sa = ServerArgs()
    a = Workload(WorkloadConfig(kind, 12, 4, seed=5), sa).arrivals_list
    b = Workload(WorkloadConfig(kind, 12, 4, seed=5), sa).arrivals_list
    c = Workload(WorkloadConfig(kind, 12, 4, seed=6), sa).arrivals_list
    assert a == b and a != c
    steps = [x.step for x in a]
    assert steps == sorted(steps) and len({x.req.rid for x in a}) == 12
    for x in a:  # every prompt fits the device pool with its generated tokens
        assert 1 <= len(x.req.input_ids) and len(x.req.input_ids) + 4 <= sa.max_total_tokens


def test_shared_prefix_workload_shares_prefixes():
    reqs = Workload(WorkloadConfig(requests=16, seed=1), ServerArgs()).requests
    heads = [r.input_ids[:48] for r in reqs]
    assert len(set(heads)) < len(heads)


def _ref(tokens, gaps):
    return {"r": {"tokens": tokens, "top2_gap": gaps}}


def test_compare_outputs_flags_real_mismatches():
    assert compare_outputs({"r": [1, 2, 3]}, _ref([1, 2, 3], [1.0] * 3)) == []
    assert compare_outputs({"r": [1, 9, 3]}, _ref([1, 2, 3], [1.0] * 3)) == [
        "r: token 1 is 9, reference 2"
    ]
    assert compare_outputs({}, _ref([1], [1.0])) == ["r: no output"]
    assert compare_outputs({"r": [1]}, _ref([1, 2], [1.0, 1.0])) == ["r: 1 tokens, reference 2"]


def test_compare_outputs_tolerates_a_greedy_tie_and_what_follows():
    tie = GAP_TOLERANCE / 10
    assert compare_outputs({"r": [1, 7, 8]}, _ref([1, 2, 3], [1.0, tie, 1.0])) == []


def test_hang_watch_sees_progress_and_stalls(tmp_path):
    w = HangWatch(tmp_path, world_size=2, hang_timeout=1.0, started=100.0)
    w.poll(now=100.0)
    assert not w.stalled(now=100.0 + 10)  # the startup grace covers imports and gloo init
    (tmp_path / "rank0.jsonl").write_text(json.dumps({"step": 0, "faults_fired": [{"f": 1}]}))
    w.poll(now=200.0)
    assert w.snapshot()[0]["step"] is None, "a line without its newline is not read yet"
    with open(tmp_path / "rank0.jsonl", "a") as fh:
        fh.write("\n")
    w.poll(now=200.0)
    assert w.snapshot()[0]["step"] == 0 and w.snapshot()[0]["faults_fired"] == 1
    assert not w.stalled(now=200.5)
    assert w.stalled(now=201.5)


def test_hang_timeout_counts_from_the_first_step_and_start_up_is_bounded(tmp_path):
    from hicache_diag.trials.hang_watch import STARTUP_GRACE_S

    w = HangWatch(tmp_path, world_size=2, hang_timeout=1.0, started=100.0)
    w.poll(now=100.0)
    assert not w.stalled(now=100.0 + STARTUP_GRACE_S - 0.1), "start-up has its grace"
    assert w.stalled(now=100.0 + STARTUP_GRACE_S + 0.1), "but a bounded one"
    (tmp_path / "rank0.jsonl").write_text(json.dumps({"step": 0, "t": 100.5}) + "\n")
    w.poll(now=100.5)
    # rank 1 has not stepped yet: the hang timeout applies all the same, from rank 0's step
    assert not w.stalled(now=101.4) and w.stalled(now=101.6)
    assert w.startup_s() == {"0": 0.5, "1": None}
    assert w.last_steps()["0"] == {"step": 0, "t": 100.5}


def test_run_config_round_trips_through_the_manifest():
    cfg = RunConfig(
        server_args=ServerArgs(pp_size=3, tp_size=2, hicache_size=1 << 20),
        protocol=build_protocol("legacy", ["ack-count=leader"]),
        workload=WorkloadConfig("random", 5, 3, 9),
        faults=("dma-delay:rank=1,ms=5",),
        seed=9,
    )
    back = config_from_dict(json.loads(json.dumps(config_to_dict(cfg))))
    assert back == cfg and dataclasses.asdict(back) == dataclasses.asdict(cfg)
    assert back.protocol.mode("ack-count") == "leader"


def test_run_dir_is_created_or_refused(tmp_path):
    d = prepare_run_dir(str(tmp_path / "a" / "b"), seed=1)
    assert (d / "stacks").is_dir()
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(UsageError, match="not writable"):
        check_writable(str(blocker / "x"))
    with pytest.raises(UsageError, match="not writable"):
        prepare_run_dir(str(blocker / "x"), seed=1)
    check_writable(str(tmp_path / "new" / "deep"))
    assert not (tmp_path / "new").exists(), "validation must not create anything"
