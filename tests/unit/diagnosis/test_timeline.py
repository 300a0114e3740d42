"""compute_timeline on hand-written records: linking, earliest latency, missing data."""

from __future__ import annotations

import json

import pytest

from hicache_diag.diagnosis.timeline import compute_timeline
from hicache_diag.errors import HicacheDiagError, RunDirError


def ev(kind, phase, ack_id, **kw):
    return {"event": kind, "phase": phase, "ack_id": ack_id, **kw}


def prefill(launch: int, load_id: int, write_id: int, node: int, write_delay: int) -> dict:
    """Records of one host-hit prefill: load at launch, its write 2 steps later."""
    return {
        launch: (
            {f"r{launch}": 8},
            [ev("load", "issued", load_id, node_ids=[node]), ev("load", "queued", load_id)],
        ),
        launch + 1: ({}, [ev("load", "consumed", load_id, node_ids=[node])]),
        launch + 2: (
            {},
            [
                ev("write", "issued", write_id, node_ids=[99], ancestor_ids=[node, 1]),
                ev("write", "queued", write_id, node_ids=[99]),
            ],
        ),
        launch + 2 + write_delay: ({}, [ev("write", "consumed", write_id, node_ids=[99])]),
    }


def write_rank(path, steps: dict) -> None:
    lines = []
    for step in range(max(steps) + 1):
        hits, events = steps.get(step, ({}, []))
        lines.append(json.dumps({"step": step, "host_hit_len": hits, "events": events}))
    path.write_text("\n".join(lines) + "\n")


def merge(*parts: dict) -> dict:
    out: dict = {}
    for part in parts:
        for step, (hits, events) in part.items():
            h, e = out.get(step, ({}, []))
            out[step] = ({**h, **hits}, e + events)
    return out


def test_earliest_latency_and_offsets(tmp_path):
    steps = merge(prefill(3, 0, 0, 10, 2), prefill(10, 1, 1, 20, 1), prefill(20, 2, 2, 30, 1))
    for rank in (0, 1):
        write_rank(tmp_path / f"rank{rank}.jsonl", steps)
    table = compute_timeline(tmp_path, pp=2, async_depth=1)
    doc = table.to_json()
    assert doc["launch_step"] == 10, "the first prefill whose acks were consumed earliest"
    assert [(e["event"], e["issued_iter"], e["delay_iters"]) for e in doc["events"]] == [
        ("load", 0, 1),
        ("write", 2, 3),
    ]
    assert doc["observed"] == {"load": {"1": 3}, "write": {"3": 2, "4": 1}}
    assert doc["ranks_agree"] and doc["samples"] == 3


def test_a_late_copy_thread_does_not_shift_the_table(tmp_path):
    # Two prefills whose write ack came one ① late (copy thread slow), one on time: the table
    # shows the on-time one, and `observed` keeps the late ones.
    steps = merge(prefill(3, 0, 0, 10, 2), prefill(10, 1, 1, 20, 2), prefill(20, 2, 2, 30, 1))
    write_rank(tmp_path / "rank0.jsonl", steps)
    doc = compute_timeline(tmp_path, pp=2, async_depth=1).to_json()
    assert doc["launch_step"] == 20
    assert [e["delay_iters"] for e in doc["events"]] == [1, 3]
    assert doc["observed"] == {"load": {"1": 3}, "write": {"3": 1, "4": 2}}


def test_a_write_elsewhere_in_the_tree_is_not_linked(tmp_path):
    steps = prefill(3, 0, 0, 10, 1)
    steps[5][1][0]["ancestor_ids"] = [77]  # not below the loaded node
    write_rank(tmp_path / "rank0.jsonl", steps)
    with pytest.raises(HicacheDiagError, match="no prefill with a host hit"):
        compute_timeline(tmp_path, pp=1, async_depth=0)


def test_ranks_that_measure_differently_do_not_agree(tmp_path):
    write_rank(tmp_path / "rank0.jsonl", prefill(3, 0, 0, 10, 1))
    write_rank(tmp_path / "rank1.jsonl", prefill(3, 0, 0, 10, 2))
    assert not compute_timeline(tmp_path, pp=2, async_depth=0).ranks_agree


def test_missing_run_dir(tmp_path):
    with pytest.raises(RunDirError, match="rank0.jsonl is missing"):
        compute_timeline(tmp_path, pp=2, async_depth=0)
