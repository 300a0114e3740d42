"""End to end through the CLI: a real `run` (2 rank processes, gloo) -> `report`, and `bisect`
over real trials (~10-15 s each on 2 cores, so not marked slow). Each asserts no process is left
behind."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

CLI = [sys.executable, "-m", "hicache_diag.cli.main"]
TINY = ["--requests", "8", "--max-new-tokens", "4", "--max-total-tokens", "256"]
FORM_A = [
    "--protocol",
    "legacy",
    "--fault",
    "host-alloc-fail:rank=1,p=0.5",
    "--hicache-ratio",
    "1.0",
    "--seed",
    "1",
]


def _no_children_left():
    kids = [p for p in psutil.Process().children(recursive=True) if p.is_running()]
    assert not [p for p in kids if p.status() != psutil.STATUS_ZOMBIE], kids


def _run(args, timeout=240):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)


def test_run_then_report_on_a_real_form_a(tmp_path):
    run_dir = tmp_path / "run"
    got = _run(["run", *TINY, *FORM_A, "--out", str(run_dir), "--json"])
    recorded = json.loads(got.stdout)
    assert got.returncode == 10, got.stderr[-2000:]
    assert (recorded["form"], recorded["failed_rank"], recorded["culprit_rank"]) == ("A", 1, 1)
    assert recorded["first_divergence"]["source"] == "host-alloc"
    plots = tmp_path / "plots"
    rep = _run(["report", str(run_dir), "--plots", str(plots)])
    assert rep.returncode == 0, rep.stderr
    assert "crash (form A), exit 10" in rep.stdout and "host-alloc" in rep.stdout
    assert len(list(plots.glob("*.png"))) == 5
    assert "![queues](queues.png)" in (plots / "report.md").read_text()
    again = _run(["report", str(run_dir), "--json", "--reclassify"])
    fresh = json.loads(again.stdout)
    assert (fresh["outcome"], fresh["form"], fresh["culprit_rank"]) == ("crash", "A", 1)
    _no_children_left()


def test_bisect_over_real_trials(tmp_path):
    argv = ["bisect", "--switch", "host-alloc=local,two-phase", "--trials", "1", "--jobs", "2"]
    got = _run([*argv, "--out", str(tmp_path / "b"), "--json", *TINY, *FORM_A], timeout=400)
    assert got.returncode == 0, got.stderr[-2000:]
    data = json.loads(got.stdout)
    assert data["schema"] == "hicache-diag/bisect/v1" and data["switches"] == ["host-alloc"]
    cells = {c["values"]["host-alloc"]: c for c in data["cells"]}
    # Legacy with failing host allocs on rank 1 always makes the ranks disagree: rank 1's first
    # write_backup (step 11, before any ack is drained, so the same in every run) fails. Whether
    # that surfaces as a crash or hang before this tiny workload ends depends on when the DMA
    # thread completes the writes (ack-count=local): if no write ack is ready at step 12, PP0
    # admits fewer requests and all 8 can finish with the trees still apart - a latent
    # divergence (exit 13), not a crash. Every outcome still names rank 1's host alloc.
    local = cells["local"]
    assert (local["trials"], local["failures"]) == (1, 1)
    assert set(local["forms"]) <= {"A", "B", "C", "diverged"}, local["forms"]
    assert local["median_ttf_s"] > 0 and len(local["run_dirs"]) == 1
    verdict = json.loads((Path(local["run_dirs"][0]) / "verdict.json").read_text())
    div = verdict["first_divergence"]
    assert (div["step"], div["field"], div["source"]) == (11, "write_backs", "host-alloc"), div
    assert verdict["culprit_rank"] == 1
    assert cells["two-phase"]["trials"] == 1 and data["verdict"]
    # 1 vs 1 trial: the 95% intervals overlap, so no switch is said to remove the failures
    assert not any("removes all failures" in line for line in data["verdict"]), data["verdict"]
    assert json.loads((tmp_path / "b" / "table.json").read_text()) == data
    assert "| host-alloc |" in (tmp_path / "b" / "table.md").read_text()
    _no_children_left()


def test_run_leak_with_unbounded_inflight_sends(tmp_path):
    args = ["run", "--requests", "16", "--max-new-tokens", "8", "--protocol", "full"]
    args += ["--switch", "inflight-sends=unbounded", "--seed", "2"]
    got = _run([*args, "--out", str(tmp_path / "r"), "--json"])
    verdict = json.loads(got.stdout)
    assert got.returncode == 15, got.stderr[-2000:]
    assert (verdict["outcome"], verdict["failed_rank"]) == ("leak", 0)
    assert "inflight_sends grew" in verdict["signature"]
    _no_children_left()


@pytest.mark.parametrize(
    "sig",
    [
        signal.SIGINT,
        pytest.param(signal.SIGTERM, marks=pytest.mark.slow),  # its reaping: test_trial_server.py
    ],
    ids=["ctrl-c", "sigterm"],
)
def test_bisect_ctrl_c_prints_partial_table_and_leaves_no_rank(tmp_path, sig):
    argv = ["bisect", "--switch", "protocol=l2,full", "--trials", "4", "--jobs", "2"]
    argv += ["--out", str(tmp_path / "b"), "--json"]
    proc = subprocess.Popen(
        [*CLI, *argv, "--requests", "32", "--max-new-tokens", "8"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline, ranks = time.monotonic() + 60, []
    while time.monotonic() < deadline and len(ranks) < 2:
        time.sleep(0.2)
        kids = psutil.Process(proc.pid).children(recursive=True)
        ranks = [k for k in kids if "scheduler_PP" in " ".join(_cmdline(k))]
    assert ranks, "no rank process started"
    everyone = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130
    data = json.loads(out)
    assert data["interrupted"] is True and "interrupted: partial table" in data["verdict"]
    assert json.loads((tmp_path / "b" / "table.json").read_text()) == data  # saved all the same
    alive = [p for p in everyone if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, alive


def _cmdline(proc):
    try:
        return [proc.name(), *proc.cmdline()]
    except psutil.Error:
        return []
