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

from hicache_diag.trials.reference import compare_outputs

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
    assert verdict["culprit_rank"] == 1, verdict
    if verdict["first_divergence"] is None:
        # Seen 1 run in ~20 (CI, and issue 14's loops): the stages hang in the PP exchange
        # before any must-agree field differs in what they recorded, so no source is located;
        # the hang and its culprit (the rank the other waits on) must still be right.
        assert (verdict["outcome"], verdict["form"]) == ("hang", "C"), verdict
        return
    assert verdict["first_divergence"]["source"] in ("l3-hit", "l3-progress"), verdict


@pytest.mark.parametrize("kind", ["file", "readonly"])
def test_bad_storage_dir_is_one_line_exit_2(tmp_path, kind, no_leftover_processes):
    if kind == "file":
        target = tmp_path / "plain"
        target.write_text("x")
        needle = "is a file; give a directory"
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


# ---- every fault at once with L3 on (OPEN 1: the prefetch's host alloc) ------------------------

EVERY_FAULT = [
    "dma-delay:rank=1,ms=20,jitter-ms=10",
    "host-alloc-fail:rank=1,p=0.5",
    # clock-skew is left out: under --protocol full the tree's clock is logical, and a fault that
    # touches nothing is refused (exit 2); tests/e2e/test_switches.py runs it with monotonic.
    "p2p-delay:rank=0,ms=3",
    "rank-stall:rank=1,ms=50,every=25",  # short: far below the hang timeout
    "l3-partial-hit:rank=1,keep=0.5,holes=0.1",
]
# requests far apart (idle): earlier ones are backed up to L3 and host-evicted, later ones prefetch
L3_UNDER_FAULTS = ["--workload", "idle", "--requests", "12", "--max-total-tokens", "128"]
L3_UNDER_FAULTS += ["--hicache-size", "192KiB", "--storage-backend", "file"]
L3_UNDER_FAULTS += ["--hicache-storage-prefetch-policy", "wait_complete"]
L3_UNDER_FAULTS += [a for spec in EVERY_FAULT for a in ("--fault", spec)]


def _every_fault_run(out: Path, seed: int, *extra: str) -> tuple[int, dict]:
    proc = _run(*L3_UNDER_FAULTS, "--seed", str(seed), "--out", str(out), *extra)
    assert proc.stdout.strip(), proc.stderr[-2000:]
    return proc.returncode, json.loads(proc.stdout)


def _assert_green_with_l3(out: Path, rc: int, verdict: dict) -> None:
    got = (rc, verdict["outcome"], verdict["first_divergence"])
    assert got == (0, "ok", None), verdict
    outputs = json.loads((out / "outputs.json").read_text())
    reference = json.loads((out / "reference.json").read_text())
    assert set(outputs) == set(reference) and compare_outputs(outputs, reference) == []
    assert _l3_hits(out, 0) == _l3_hits(out, 1) > 0, "L3 was used, and agreed on"
    votes = [_prefetch_votes(out, r) for r in range(2)]
    assert votes[0] == votes[1], f"both stages took the same decisions: {votes}"


def _prefetch_votes(out: Path, rank: int) -> list[int]:
    return [f for r in _rows(out, rank) for f in r["sync_received"].get("prefetch_alloc", [])]


def test_full_protocol_every_fault_with_l3_is_green(tmp_path, no_leftover_processes):
    out = tmp_path / "run"
    rc, verdict = _every_fault_run(out, 1)
    _assert_green_with_l3(out, rc, verdict)
    fired = {f["fault"] for r in _rows(out, 1) for f in r.get("faults_fired", [])}
    assert {"host-alloc-fail", "l3-partial-hit", "rank-stall"} <= fired, fired
    assert 0 in _prefetch_votes(out, 0), "a prefetch alloc failed on PP1 and PP0 obeyed the MIN"
    assert 1 in _prefetch_votes(out, 0), "and others were committed on both stages"


def test_local_host_alloc_under_every_fault_with_l3_still_fails(tmp_path, no_leftover_processes):
    """The legacy mode of the governing switch keeps the per-rank decision reproducible."""
    rc, verdict = _every_fault_run(tmp_path / "run", 1, "--switch", "host-alloc=local")
    assert verdict["outcome"] != "ok" and rc in (10, 11, 12, 13, 14), verdict
    assert verdict["first_divergence"]["source"] == "host-alloc", verdict


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["wait_complete", "best_effort", "timeout"])
def test_full_protocol_every_fault_with_l3_over_seeds(policy, tmp_path, no_leftover_processes):
    for seed in range(2, 7):
        out = tmp_path / f"seed{seed}"
        rc, verdict = _every_fault_run(out, seed, "--hicache-storage-prefetch-policy", policy)
        _assert_green_with_l3(out, rc, verdict)
        # best_effort stops at the first look, before any hit count needs host slots
        assert policy == "best_effort" or _prefetch_votes(out, 0), "the vote path ran"


def test_full_protocol_every_fault_with_l3_and_write_back_is_green(tmp_path, no_leftover_processes):
    """write_back evicts at ②, where no vote can run: the victim waits for the next ①'s vote."""
    out = tmp_path / "run"
    rc, verdict = _every_fault_run(out, 5, "--hicache-write-policy", "write_back")
    _assert_green_with_l3(out, rc, verdict)
    refused = [sum(r["host_alloc_failed"] for r in _rows(out, k)) for k in range(2)]
    assert refused[0] == refused[1] > 0, f"allocs failed on PP1 and were refused on both: {refused}"
    assert all(sum(r["write_backs"] for r in _rows(out, k)) > 0 for k in range(2))
