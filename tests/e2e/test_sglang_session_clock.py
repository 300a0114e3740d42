"""The session reap tick on real SGLang 0.5.23 (docs/sources.md, "The hunt, 0.5.23"): a deferred
session close is applied on each rank's own 1 s tick, and the ranks part in between.

The committed run is read without SGLang (fast); the live run launches SGLang (slow)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hicache_diag.errors import UsageError
from hicache_diag.sglang.install import probe_sglang
from tests.conftest import assert_no_children

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "samples" / "scenarios" / "sglang" / "form_a_session_close_0.5.23.toml"
RUN = ROOT / "samples" / "runs" / "sglang-0.5.23-session-close"


def _lines(run: Path, rank: int) -> list[dict]:
    return [json.loads(raw) for raw in (run / f"rank{rank}.jsonl").read_text().splitlines()]


def _session_release_parts_the_ranks(run: Path) -> None:
    """One rank's reap closed the session at the step the ranks first disagree, the other's
    did not, and what the two ranks decided there differs (evicted, batch)."""
    verdict = json.loads((run / "verdict.json").read_text())
    assert verdict["outcome"] == "crash" and verdict["form"] == "A", verdict["signature"]
    step = verdict["first_divergence"]["step"]
    closed = {}
    for rank in (0, 1):
        seen = [ln for ln in _lines(run, rank) if ln.get("sessions_closed")]
        closed[rank] = seen[0]["step"] if seen else None
    reaped = [r for r, s in closed.items() if s is not None and s <= step]
    assert len(reaped) == 1, f"exactly one rank reaped the session by step {step}: {closed}"
    other = 1 - reaped[0]
    assert closed[other] is None or closed[other] > step, closed
    at = {r: [ln for ln in _lines(run, r) if ln["step"] == step and "rids" in ln]
          for r in (0, 1)}  # fmt: skip
    assert at[0] and at[1], "both ranks recorded the step they parted at"
    assert at[0][0]["rids"] != at[1][0]["rids"] or at[0][0].get("evicted") != at[1][0].get(
        "evicted"
    )


def test_committed_run_shows_one_rank_reaping_first():
    _session_release_parts_the_ranks(RUN)


def _held_0523() -> bool:
    try:
        return probe_sglang(None).version == "0.5.23"
    except UsageError:
        return False


@pytest.mark.slow
@pytest.mark.process
def test_live_session_close_parts_the_ranks_on_their_reap_ticks(tmp_path):
    if not _held_0523():
        pytest.skip("sglang 0.5.23 is not the interpreter's release")
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "hicache_diag.cli.main", "run", "--scenario", str(SCENARIO),
           "--check", "--out", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    _session_release_parts_the_ranks(out)
    assert_no_children()
