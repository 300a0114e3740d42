"""HiCache L3 through `hicache-diag run`: a warm start over one storage directory, a truncated
page file, the l3_divergence scenario under both protocols, and bad storage directories. Real
rank processes, real gloo, real page files."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "hicache_diag.cli.main", "run"]
SCENARIO = str(Path(__file__).parents[2] / "samples" / "scenarios" / "l3_divergence.toml")
# the scenario's workload and sizes, with every fix on and no fault: the warm-start setting
WARM = ["--scenario", SCENARIO, "--protocol", "full", "--requests", "8"]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args, "--json"], capture_output=True, text=True, timeout=240)


def _rows(out: Path, rank: int) -> list[dict]:
    return [json.loads(line) for line in (out / f"rank{rank}.jsonl").read_text().splitlines()]


def _l3_hits(out: Path, rank: int) -> int:
    return sum(sum((r.get("l3_hit_len") or {}).values()) for r in _rows(out, rank))


def _inserted(out: Path, rank: int) -> int:
    return sum(r.get("l3_inserted", 0) for r in _rows(out, rank))


@pytest.fixture(scope="module")
def populated(tmp_path_factory):
    """One cold run that backs its pages up to a shared storage directory."""
    base = tmp_path_factory.mktemp("l3")
    store = base / "store"
    proc = _run(*WARM, "--storage-dir", str(store), "--out", str(base / "cold"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return base, store


def test_second_run_over_one_directory_hits_l3_on_every_rank(populated, no_leftover_processes):
    base, store = populated
    files = sorted(os.listdir(store))
    assert files and all(f.endswith(("_2_0.bin", "_2_1.bin")) for f in files), files[:3]
    cold = [_l3_hits(base / "cold", r) for r in range(2)]
    out = base / "warm"
    proc = _run(*WARM, "--storage-dir", str(store), "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    verdict = json.loads(proc.stdout)
    assert verdict["outcome"] == "ok", "outputs equal the no-cache reference"
    warm = [_l3_hits(out, r) for r in range(2)]
    assert all(w > c for w, c in zip(warm, cold, strict=True)), (cold, warm)
    assert all(_inserted(out, r) > 0 for r in range(2)), "fetched pages entered the host tree"
    assert warm[0] == warm[1], "the hit MIN gives both stages the same hits"


def test_truncated_page_file_is_a_storage_fault_in_the_verdict(populated, no_leftover_processes):
    base, store = populated
    broken = base / "broken"
    shutil.copytree(store, broken)
    victims = sorted(f for f in os.listdir(broken) if f.endswith("_2_1.bin"))
    for name in victims:  # every page of PP1: whatever the first L3 read is, it is short
        with open(broken / name, "r+b") as f:
            f.truncate(5)
    out = base / "truncated"
    proc = _run(*WARM, "--storage-dir", str(broken), "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    verdict = json.loads(proc.stdout)
    assert verdict["outcome"] == "ok", "a short page is a miss on every rank (progress MIN)"
    lines = [e for e in verdict["evidence"] if e.startswith("storage fault on rank 1")]
    assert lines and "short read" in lines[0], verdict["evidence"]
    assert _inserted(out, 0) == _inserted(out, 1) == 0, "nothing read from PP1's pages"


def test_l3_divergence_scenario_full_protocol_is_ok(tmp_path, no_leftover_processes):
    out = tmp_path / "run"
    proc = _run("--scenario", SCENARIO, "--protocol", "full", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["outcome"] == "ok"
    assert _l3_hits(out, 0) == _l3_hits(out, 1) > 0, "L3 was used, and agreed on"
    local = [sum(sum(r["l3_hit_len_local"].values()) for r in _rows(out, k)) for k in range(2)]
    assert local[1] < local[0], "the fault shortened PP1's own view; the MIN absorbed it"


def test_l3_divergence_scenario_legacy_l3_is_not_ok(tmp_path, no_leftover_processes):
    proc = _run("--scenario", SCENARIO, "--out", str(tmp_path / "run"))
    verdict = json.loads(proc.stdout)
    assert verdict["outcome"] != "ok" and proc.returncode in (10, 11, 12, 13, 14)
    assert verdict["first_divergence"]["source"] in ("l3-hit", "l3-progress"), verdict


@pytest.mark.parametrize("kind", ["file", "readonly"])
def test_bad_storage_dir_is_one_line_exit_2(tmp_path, kind, no_leftover_processes):
    if kind == "file":
        target = tmp_path / "plain"
        target.write_text("x")
        needle = "is not a directory"
    elif os.geteuid() == 0:  # root writes into mode-0500 directories; not into /proc
        target = Path("/proc/hicache-diag-no-such-dir")
        needle = "is not writable"
    else:
        target = tmp_path / "ro"
        target.mkdir()
        target.chmod(0o500)
        needle = "is not writable"
    out = tmp_path / "run"
    proc = _run("--storage-backend", "file", "--storage-dir", str(target), "--out", str(out))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr
    assert not out.exists(), "nothing started"
