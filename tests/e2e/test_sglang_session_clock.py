"""The session reap tick on real SGLang 0.5.23 (docs/sources.md, "The hunt, 0.5.23"): a deferred
session close is applied on each rank's own 1 s tick, and the ranks part in between.

The committed run is read without SGLang (fast); the live run launches SGLang (slow)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hicache_diag.cli.main import run_cli
from hicache_diag.engines.sglang.release import probe_sglang
from hicache_diag.errors import UsageError
from tests.conftest import assert_no_children

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "samples" / "scenarios" / "sglang" / "session_close_0.5.23.toml"
RUNS = ("sglang-0.5.23-session-close", "sglang-0.5.23-session-timeout")


def _lines(run: Path, rank: int) -> list[dict]:
    return [json.loads(raw) for raw in (run / f"rank{rank}.jsonl").read_text().splitlines()]


def _session_release_parts_the_ranks(run: Path) -> None:
    """Up to the step the ranks first disagree, their reaps released sessions at different
    steps, one of them within a few steps of the disagreement; the run ended in form A or C."""
    verdict = json.loads((run / "verdict.json").read_text())
    assert (verdict["outcome"], verdict["form"]) in (("crash", "A"), ("hang", "C")), verdict
    step = verdict["first_divergence"]["step"]
    reaps = [
        {ln["step"] for ln in _lines(run, rank) if ln.get("sessions_closed") and ln["step"] <= step}
        for rank in (0, 1)
    ]
    apart = reaps[0] ^ reaps[1]
    assert apart, f"both ranks reaped in the same steps up to step {step}: {reaps}"
    assert step - max(apart) <= 8, f"no reap near the divergence at step {step}: {reaps}"


def _sources_run_marks_the_session_clock(run: Path, data: dict) -> None:
    """`sources --run` (the dynamic half) on the run: the session clock's decision acted apart
    (one rank closed the session, the other did not) at or before the first divergence."""
    clock = next(s for s in data["sources"] if s["name"] == "session-clock")
    step = json.loads((run / "verdict.json").read_text())["first_divergence"]["step"]
    apart = clock["first_apart"]
    assert apart is not None and apart["step"] <= step, clock
    closed = sorted(sum(d) for d in apart["outcomes"].values())
    assert closed[0] == 0 and closed[-1] >= 1, apart  # one rank released, another did not


@pytest.mark.parametrize("name", RUNS)
def test_committed_run_shows_one_rank_reaping_first(name):
    _session_release_parts_the_ranks(ROOT / "samples" / "runs" / name)


def test_committed_run_sources_mark_the_session_clock(capsys):
    """The run recorded with the dynamic probes: PP1 closed the session at step 239, PP0 idled
    there and had not closed it when the stages parted at step 244 (form A)."""
    run = ROOT / "samples" / "runs" / "sglang-0.5.23-session-close-sources"
    _session_release_parts_the_ranks(run)
    assert run_cli(["sources", "--run", str(run), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    _sources_run_marks_the_session_clock(run, data)
    by_name = {s["name"]: s for s in data["sources"]}
    # PP0 alone counts the DMA acks (its count is relayed): nothing to compare, nothing apart.
    assert by_name["dma-ack-count.write"]["ranks_read"] == [0]
    assert by_name["dma-ack-count.write"]["steps_apart"] == 0


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
    cmd = [
        sys.executable,
        "-m",
        "hicache_diag.cli.main",
        "run",
        "--scenario",
        str(SCENARIO),
        "--check",
        "--out",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    _session_release_parts_the_ranks(out)
    cmd = [sys.executable, "-m", "hicache_diag.cli.main", "sources", "--run", str(out), "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    _sources_run_marks_the_session_clock(out, json.loads(proc.stdout))
    assert_no_children()
