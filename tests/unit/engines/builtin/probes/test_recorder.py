"""rank{r}.jsonl lines: evidence keys, must_agree by protocol, probe stats win over defaults."""

from __future__ import annotations

import json
from types import SimpleNamespace

from hicache_diag.engines.builtin.probes.recorder import MUST_AGREE, RankRecorder
from hicache_diag.engines.builtin.runtime.protocol import build_protocol
from hicache_diag.faults.hooks import Hooks


class _Tree:
    def __init__(self, stats):
        self.stats = stats

    def probe_stats(self):
        return dict(self.stats)

    def tree_digest(self):
        return "d1"


def _record(tmp_path, protocol, storage=False, stats=None, extra=None):
    rec = RankRecorder(tmp_path / "r.jsonl", 3, 1, 1, protocol=protocol, storage=storage)
    hooks = Hooks(3, 1, 1)
    hooks.record("rank-stall", stall_ms=5)
    rec.record(
        step=4,
        slot=0,
        batch=None,
        tree_cache=_Tree(stats or {}),
        allocator=SimpleNamespace(available_size=lambda: 96),
        hooks=hooks,
        comm=SimpleNamespace(inflight_sends=lambda: 2),
        extra=extra,
    )
    rec.close()
    return json.loads((tmp_path / "r.jsonl").read_text())


def test_line_has_the_contract_keys(tmp_path):
    line = _record(tmp_path, build_protocol("full"), extra={"evicted_by_scheduler": 8})
    assert (line["rank"], line["pp"], line["tp"], line["step"], line["slot"]) == (3, 1, 1, 4, 0)
    assert line["rids"] == [] and line["forward_mode"] is None
    assert line["device_free"] == 96 and line["inflight_sends"] == 2
    assert line["tree_digest"] == "d1" and line["evicted"] == 8
    assert line["faults_fired"] == [{"fault": "rank-stall", "step": 0, "stall_ms": 5}]
    assert set(MUST_AGREE) <= set(line["must_agree"])
    assert "host_capacity" in line["must_agree"], "host-capacity=min makes capacity agree"


def test_legacy_capacity_and_storage_change_must_agree(tmp_path):
    line = _record(tmp_path, build_protocol("legacy"), storage=True)
    assert "host_capacity" not in line["must_agree"] and "l3_hit_len" in line["must_agree"]


def test_probe_stats_override_the_scheduler_view(tmp_path):
    stats = {"evicted": 12, "acks_consumed": {"write": 2, "load": 1}}
    line = _record(tmp_path, build_protocol("full"), stats=stats, extra={"evicted_by_scheduler": 8})
    assert line["evicted"] == 12 and line["acks_consumed"] == {"write": 2, "load": 1}


def test_recording_off_writes_heartbeats_and_still_drains(tmp_path, monkeypatch):
    """HICACHE_DIAG_RECORD=0 (bench/probe_cost.py): one small progress line per step, the
    per-step counters drained all the same so nothing piles up."""
    monkeypatch.setenv("HICACHE_DIAG_RECORD", "0")
    drained = []

    class Tree(_Tree):
        def probe_stats(self):
            drained.append(1)
            return {}

        def tree_digest(self):
            raise AssertionError("recording off must not hash the tree")

    rec = RankRecorder(tmp_path / "r.jsonl", 3, 1, 1, protocol=build_protocol("full"))
    hooks = Hooks(3, 1, 1)
    hooks.record("rank-stall", stall_ms=5)
    comm = SimpleNamespace(inflight_sends=lambda: 0, take_sync_seconds=lambda: {"pp_sync": 1.0})
    rec.record(
        step=4, slot=1, batch=None, tree_cache=Tree({}), allocator=None, hooks=hooks, comm=comm
    )
    rec.close()
    line = json.loads((tmp_path / "r.jsonl").read_text())
    assert set(line) == {"rank", "pp", "tp", "step", "slot", "t", "recorded"}
    assert line["recorded"] is False and line["step"] == 4
    assert drained == [1] and hooks.fired == []


def test_sync_seconds_are_recorded_per_step(tmp_path):
    rec = RankRecorder(tmp_path / "r.jsonl", 0, 0, 0, protocol=build_protocol("full"))
    taken = iter([{"pp_sync": 0.0012345678}, {}])
    comm = SimpleNamespace(inflight_sends=lambda: 0, take_sync_seconds=lambda: next(taken))
    for step in (0, 1):
        rec.record(
            step=step,
            slot=0,
            batch=None,
            tree_cache=_Tree({}),
            allocator=SimpleNamespace(available_size=lambda: 1),
            hooks=Hooks(),
            comm=comm,
        )
    rec.close()
    lines = [json.loads(x) for x in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert [x["sync_s"] for x in lines] == [{"pp_sync": 0.001235}, {}]


def test_crash_record_carries_the_steps_inputs_outside_must_agree(tmp_path):
    rec = RankRecorder(tmp_path / "r.jsonl", 1, 1, 0, protocol=build_protocol("full"))
    stats = {"l3_progress": {"r1": 12}, "l3_progress_local": {"r1": 12}, "tree_digest": "x"}
    rec.record_crash(
        step=7, slot=0, batch=None, proxy=None, error=RuntimeError("boom"), tree_cache=_Tree(stats)
    )
    rec.close()
    line = json.loads((tmp_path / "r.jsonl").read_text())
    assert line["crashed"] is True and line["l3_progress_local"] == {"r1": 12}
    assert "tree_digest" not in line and "l3_progress" not in line["must_agree"]


def test_every_line_kind_is_a_step_record_written_by_the_one_writer(tmp_path, monkeypatch):
    """A full step, a crash record and a heartbeat each read back as evidence.StepRecord and
    write out as the same bytes (the writer both engines' recorders share)."""
    from hicache_diag import evidence as ev

    _record(tmp_path, build_protocol("full"), extra={"evicted_by_scheduler": 8, "num_waiting": 2})
    rec = RankRecorder(tmp_path / "r.jsonl", 3, 1, 1, protocol=build_protocol("full"))
    rec.record_crash(step=5, slot=1, batch=None, proxy=None, error=RuntimeError("boom"))
    monkeypatch.setenv("HICACHE_DIAG_RECORD", "0")
    off = RankRecorder(tmp_path / "r.jsonl", 3, 1, 1, protocol=build_protocol("full"))
    off.record(
        step=6,
        slot=0,
        batch=None,
        tree_cache=_Tree({}),
        allocator=None,
        hooks=Hooks(),
        comm=SimpleNamespace(),
    )
    rec.close()
    off.close()
    lines = (tmp_path / "r.jsonl").read_text().splitlines()
    records = [r for _, r in ev.read_steps(tmp_path / "r.jsonl")]
    assert [r.line() for r in records] == lines
    assert [(r.step, r.crashed, r.recorded) for r in records] == [
        (4, None, None),
        (5, True, None),
        (6, None, False),
    ]
    assert records[0].num_waiting == 2 and records[0].extra == {}
