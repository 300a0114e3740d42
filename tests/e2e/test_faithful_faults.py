"""The physical faults end to end through the CLI: a host shortage and a late DMA completion,
on the builtin engine and on real SGLang 0.5.23 (the "Done means" of the faithful-faults work).

The real-SGLang runs take 5-8 minutes each on this machine and are `slow`; the form they
produce stays in the default run through the committed run directory
samples/runs/sglang-0.5.23-form-b (test_committed_host_shortage_run_holds_its_facts).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hicache_diag.errors import UsageError
from tests.conftest import assert_no_children

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "hicache_diag.cli.main", "run", "--json"]
COMMITTED = ROOT / "samples" / "runs" / "sglang-0.5.23-form-b"


def _rows(run: Path, rank: int) -> list[dict]:
    return [json.loads(line) for line in (run / f"rank{rank}.jsonl").read_text().splitlines()]


def _first_shortage(run: Path, rank: int) -> dict | None:
    for row in _rows(run, rank):
        if row.get("host_shortages"):
            return row
    return None


def _assert_physical_shortage(run: Path, rank: int, sglang: bool = True) -> None:
    """At the failing rank's first skipped backup: host_free below what it needed, evict_host
    ran, the shortage counted; no peer counted one."""
    row = _first_shortage(run, rank)
    assert row is not None, f"rank {rank} counted no host shortage"
    first = row["host_shortages"][0]
    assert first["free"] < first["need"], first
    assert first["evict_calls"] >= 1, first
    assert row["host_shortage"] >= 1
    if sglang:  # 0.5.23 returns before alloc; the builtin (0.5.1x's shape) tries alloc first
        assert row.get("host_alloc_failed", 0) == 0
    others = [r for r in (0, 1) if r != rank]
    assert all(_first_shortage(run, r) is None for r in others)


def _run(tmp_path: Path, *args: str) -> tuple[dict, Path]:
    out = tmp_path / "run"
    proc = subprocess.run(
        [*CLI, "--out", str(out), *args], capture_output=True, text=True, timeout=1500
    )
    assert proc.stdout, proc.stderr[-3000:]
    assert_no_children()
    return json.loads(proc.stdout), out


@pytest.mark.skipif(not COMMITTED.is_dir(), reason="no committed host-shortage run")
def test_committed_host_shortage_run_holds_its_facts():
    verdict = json.loads((COMMITTED / "verdict.json").read_text())
    assert verdict["outcome"] == "crash" and verdict["culprit_rank"] == 1
    _assert_physical_shortage(COMMITTED, 1)


def test_committed_dma_delay_run_shows_the_forward_waiting():
    run = ROOT / "samples" / "runs" / "sglang-0.5.23-dma-delay"
    waited = {r: sum(row.get("dma_wait_ms", 0) or 0 for row in _rows(run, r)) for r in (0, 1)}
    assert waited[1] > 0 and waited[0] == 0, waited
    assert json.loads((run / "verdict.json").read_text())["outcome"] == "ok"


@pytest.mark.process
@pytest.mark.slow
def test_builtin_host_shortage_is_skipped_backups_on_that_rank(tmp_path):
    verdict, run = _run(
        tmp_path, "--protocol", "legacy", "--fault", "host-shortage:rank=1,leave=0,after=5"
    )
    assert verdict["culprit_rank"] == 1
    assert verdict["first_divergence"]["source"] == "host-alloc"
    _assert_physical_shortage(run, 1, sglang=False)


@pytest.mark.process
@pytest.mark.slow
def test_builtin_dma_delay_makes_the_forward_wait(tmp_path):
    verdict, run = _run(tmp_path, "--fault", "dma-delay:rank=1,ms=30,dir=load")
    assert verdict["outcome"] == "ok"
    waited = {r: sum(row.get("dma_wait_ms", 0) or 0 for row in _rows(run, r)) for r in (0, 1)}
    # Rank 0 may wait on its own copy thread too; rank 1 waits 30 ms more per late load.
    assert waited[1] >= 30 and waited[1] > waited[0], waited


def _sglang_0_5_23() -> bool:
    from hicache_diag.engines.sglang.release import probe_sglang

    try:
        return probe_sglang().version == "0.5.23"
    except UsageError:
        return False


real = pytest.mark.skipif(not _sglang_0_5_23(), reason="needs sglang 0.5.23 in this interpreter")


@real
@pytest.mark.process
@pytest.mark.slow
def test_sglang_host_shortage_takes_sglangs_own_shortage_branch(tmp_path):
    verdict, run = _run(
        tmp_path,
        "--engine",
        "sglang",
        "--max-total-tokens",
        "256",
        "--fault",
        "host-shortage:rank=1,leave=0",
    )
    assert verdict["outcome"] == "crash" and verdict["culprit_rank"] == 1
    _assert_physical_shortage(run, 1)


@real
@pytest.mark.process
@pytest.mark.slow
def test_sglang_dma_delay_makes_the_forward_wait(tmp_path):
    # 30 ms hides behind PP1's wait for PP0's activations (measured: no forward wait); 400 ms
    # on the load-backs outlasts it.
    verdict, run = _run(
        tmp_path,
        "--engine",
        "sglang",
        "--max-total-tokens",
        "256",
        "--fault",
        "dma-delay:rank=1,ms=400,dir=load",
    )
    waited = {r: sum(row.get("dma_wait_ms", 0) or 0 for row in _rows(run, r)) for r in (0, 1)}
    assert waited[1] > 0 and waited[1] > waited[0], waited
