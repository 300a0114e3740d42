"""`sources --run` (the dynamic half) on committed real-SGLang runs recorded with the source
probes, through the CLI; no SGLang needed. The 0.5.23 session-close run is checked in
test_sglang_session_clock.py (with its live run)."""

from __future__ import annotations

import json
from pathlib import Path

from hicache_diag.cli.main import run_cli

RUNS = Path(__file__).resolve().parents[2] / "samples" / "runs"


def test_0518_l3_control_queues_are_drained_apart_before_the_stages_part(capsys):
    """0.5.18, PP2, L3, no fault: each stage drains its own L3 control queues (a MIN over its
    TP group only), so one stage acts on a backup ack or a storage hit a step before the other;
    the stages then run different batches (verdict: first divergence) and crash."""
    run = RUNS / "sglang-0.5.18-l3-no-fault-sources"
    assert run_cli(["sources", "--run", str(run), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    queues = next(s for s in data["sources"] if s["name"] == "l3-control-queues")
    verdict = json.loads((run / "verdict.json").read_text())
    apart = queues["first_apart"]
    assert queues["ranks_read"] == [0, 1] and queues["steps_apart"] >= 1
    assert apart["step"] <= verdict["first_divergence"]["step"], (apart, verdict)
    assert sorted(bool(d) for d in apart["outcomes"].values()) == [False, True], apart
    # The ack count is PP0's, relayed: read by PP0 alone and never drained apart.
    acks = next(s for s in data["sources"] if s["name"] == "dma-ack-count.write")
    assert acks["ranks_read"] == [0] and acks["steps_apart"] == 0


def test_0518_table_names_the_drain_and_its_first_apart_step(capsys):
    run = RUNS / "sglang-0.5.18-l3-no-fault-sources"
    assert run_cli(["sources", "--run", str(run)]) == 0
    out = capsys.readouterr().out
    assert "l3-control-queues, first apart at step 45: r0: [[0,0,0]]; r1: [[0,1,0]] -> " in out
