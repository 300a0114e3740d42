"""The first-divergence block on real SGLang 0.5.23: a run with `--sglang-consensus-checker` whose
ranks part writes first_divergence/rank{r}.json for every rank before SGLang's checker exits
them, and `report` shows it (docs/evidence.md, "first_divergence/rank{r}.json").

The scenario is the PP2 flush-clock one: PP1 flushes its tree and PP0 times out, and the next
shared-prefix request makes both stages call `match_prefix` with different results (64 hit
tokens against 0), which the checker compares. The divergences that one stage acts on alone
(form A/B/C host-shortage, the session reap) are invisible to it: the peer never makes the
matching call, or crashes in the same slot first (docs/evidence.md).

Slow: one real launch, 12-15 minutes here (start-up alone takes 4-8 on a loaded 2-core box)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hicache_diag import evidence as ev
from hicache_diag.engines.sglang.install import probe_sglang
from hicache_diag.errors import UsageError
from tests.conftest import assert_no_children

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "samples" / "scenarios" / "sglang" / "flush_clock_0.5.23.toml"
READY_TIMEOUT_S = "1200"  # SGLang's start-up on a loaded box (HICACHE_DIAG_SGLANG_READY_TIMEOUT)


def _held_0523() -> bool:
    try:
        return probe_sglang(None).version == "0.5.23"
    except UsageError:
        return False


def _cli(*args: str, timeout: int) -> subprocess.CompletedProcess:
    env = dict(os.environ, HICACHE_DIAG_SGLANG_READY_TIMEOUT=READY_TIMEOUT_S)
    cmd = [sys.executable, "-m", "hicache_diag.cli.main", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def _blocks_agree_on_the_batch_not_the_hash(blocks: dict[int, ev.DivergenceBlock]) -> None:
    """Each rank saw the same batch length and wrote a different hash, with its own state."""
    assert len({b.n_events for b in blocks.values()}) == 1, blocks
    assert len({b.local_hash for b in blocks.values()}) == len(blocks), blocks
    for rank, block in blocks.items():
        assert block.thread == "rank_consensus_checker", block.thread  # SGLang's worker
        assert block.events and block.steps and block.device_free is not None, rank
        assert any(s.name == "MainThread" and s.frames for s in block.stacks), rank
        assert block.pid is not None


@pytest.mark.slow
@pytest.mark.process
def test_checker_divergence_writes_a_block_per_rank_and_report_shows_it(tmp_path):
    if not _held_0523():
        pytest.skip("sglang 0.5.23 is not the interpreter's release")
    out = tmp_path / "run"
    args = ("run", "--scenario", str(SCENARIO), "--sglang-consensus-checker", "--out", str(out))
    proc = _cli(*args, timeout=2400)
    assert proc.returncode != 2, proc.stderr[-4000:]
    world = ev.Manifest.from_json(ev.read_json(out / ev.MANIFEST)).topology.world_size
    assert "Found rank divergence for" in (out / ev.SERVER_LOG).read_text()
    blocks = ev.read_blocks(out)
    assert sorted(blocks) == list(range(world)), sorted(blocks)
    _blocks_agree_on_the_batch_not_the_hash(blocks)
    report = _cli("report", str(out), timeout=600)
    assert report.returncode == 0, report.stderr[-2000:]
    assert "first-divergence block (SGLang's rank consensus checker)" in report.stdout
    assert "first differing event" in report.stdout
    assert "no block from rank" not in report.stdout
    assert_no_children()
