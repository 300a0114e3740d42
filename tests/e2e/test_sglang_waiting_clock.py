"""The waiting timeout on real SGLang 0.5.19 (samples/scenarios/sglang/waiting_timeout_0.5.19.toml):
each rank drops timed-out waiting requests on its own perf_counter
(`Scheduler._abort_on_waiting_timeout`), recorded by the plugin's `waiting-clock` probe. Slow: one
launch, about 80 s of run here after start-up; the stages part in about 9 runs of 10."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hicache_diag.engines.sglang.release import probe_sglang, venv_python_for
from hicache_diag.errors import UsageError
from tests.conftest import assert_no_children

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "samples" / "scenarios" / "sglang" / "waiting_timeout_0.5.19.toml"


def _held(version: str) -> bool:
    try:
        return probe_sglang(venv_python_for(version)).version == version
    except UsageError:
        return False


def _drops(run: Path, rank: int) -> tuple[list[str], dict[str, int]]:
    """(the probes armed on the rank, rid -> the step its own waiting timeout dropped it)."""
    rows = [json.loads(ln) for ln in (run / f"rank{rank}.jsonl").read_text().splitlines()]
    dropped: dict[str, int] = {}
    for row in rows:
        for rids in ((row.get("sources") or {}).get("waiting-clock") or {}).get("d") or ():
            for rid in rids:
                dropped.setdefault(rid, row["step"])
    return rows[0].get("sources_armed") or [], dropped


@pytest.mark.slow
@pytest.mark.process
def test_live_waiting_timeout_is_named_by_the_ranks_own_drops(tmp_path):
    if not _held("0.5.19"):
        pytest.skip("needs $HICACHE_DIAG_SGLANG_VENVS/sglang-0.5.19")
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "hicache_diag.cli.main", "run", "--scenario", str(SCENARIO)]
    proc = subprocess.run([*cmd, "--out", str(out)], capture_output=True, text=True, timeout=1500)
    assert proc.returncode in (0, 10, 11, 12, 13, 16), proc.stderr[-4000:]
    armed0, drops0 = _drops(out, 0)
    armed1, drops1 = _drops(out, 1)
    assert "waiting-clock" in armed0 and "waiting-clock" in armed1
    assert drops0 and drops1, "the overload timed out waiting requests on both stages"
    verdict = json.loads((out / "verdict.json").read_text())
    if verdict["outcome"] != "ok":  # about 1 run in 10 the stages agree to the end
        fd = verdict["first_divergence"]
        assert fd["source"] == "waiting-clock", verdict["evidence"]
        by = [{rid for rid, s in d.items() if s <= fd["step"]} for d in (drops0, drops1)]
        lone = by[0] ^ by[1]
        assert lone, f"no request dropped on one stage only by step {fd['step']}"
    assert_no_children()
