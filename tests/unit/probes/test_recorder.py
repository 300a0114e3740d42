"""rank{r}.jsonl lines: evidence keys, must_agree by protocol, probe stats win over defaults."""

from __future__ import annotations

import json
from types import SimpleNamespace

from hicache_diag.hooks import Hooks
from hicache_diag.probes.recorder import MUST_AGREE, StepRecorder
from hicache_diag.runtime.protocol import build_protocol


class _Tree:
    def __init__(self, stats):
        self.stats = stats

    def probe_stats(self):
        return dict(self.stats)

    def tree_digest(self):
        return "d1"


def _record(tmp_path, protocol, storage=False, stats=None, extra=None):
    rec = StepRecorder(tmp_path / "r.jsonl", 3, 1, 1, protocol=protocol, storage=storage)
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
