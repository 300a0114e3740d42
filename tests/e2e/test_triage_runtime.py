"""Live triage of our own runtime: a real hung run (a DMA that never completes on PP1, so PP1
blocks in its scheduler thread at the ack event while PP0 waits on p2p) and a healthy busy run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from hicache_diag.cli.main import run_cli

pytestmark = pytest.mark.slow


def _start_run(tmp_path, *args: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "hicache_diag.cli.main", "run", "--out", str(tmp_path / "run")]
    return subprocess.Popen(cmd + list(args), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait_for_ranks(proc: subprocess.Popen[bytes], count: int, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        titles = [" ".join(c.cmdline()) for c in psutil.Process(proc.pid).children(True)]
        if sum(t.startswith("hicache-diag::scheduler") for t in titles) == count:
            return
        time.sleep(0.2)
    raise AssertionError("the runtime's rank processes did not come up")


def _lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except OSError:
        return 0


def _wait_for_wedge(run_dir: Path, world: int, quiet_s: float = 2.0, timeout: float = 120):
    """Poll the rank jsonl files until every rank has stepped and none has written a line for
    `quiet_s`: the wedge has formed (instead of sleeping a fixed time and hoping)."""
    paths = [run_dir / f"rank{r}.jsonl" for r in range(world)]
    end, last, since = time.monotonic() + timeout, None, time.monotonic()
    while time.monotonic() < end:
        now = [_lines(p) for p in paths]
        if now != last:
            last, since = now, time.monotonic()
        elif all(now) and time.monotonic() - since >= quiet_s:
            return
        time.sleep(0.1)
    raise AssertionError(f"the run never wedged: lines per rank {last}")


def _wait_for_steps(run_dir: Path, steps: int, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while _lines(run_dir / "rank1.jsonl") < steps:
        assert time.monotonic() < end, f"rank 1 never reached step {steps}"
        time.sleep(0.1)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Ctrl-C our own run (it reaps its ranks), then make sure of it."""
    tree = psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    _, alive = psutil.wait_procs(tree, timeout=10)
    for p in alive:
        p.kill()
    psutil.wait_procs(alive, timeout=5)


def _triage(capsys, pid: int) -> tuple[int, dict]:
    # three samples: on a loaded 2-core box one rank may not run at all for a second
    argv = ["triage", "--discover", "--parent", str(pid), "--samples", "3", "--interval", "1"]
    argv.append("--json")
    code = run_cli(argv)
    return code, json.loads(capsys.readouterr().out)


def test_triage_names_the_hung_rank_of_a_real_run(tmp_path, capsys):
    run = _start_run(
        tmp_path, "--pp", "2", "--fault", "dma-delay:rank=1,ms=120000", "--hang-timeout", "120"
    )
    try:
        _wait_for_ranks(run, 2)
        _wait_for_wedge(tmp_path / "run", 2)  # PP1 blocked at writing_check on its first ack
        code, data = _triage(capsys, run.pid)
    finally:
        _stop(run)
    assert (code, data["kind"], data["form"]) == (12, "hang", "C")
    assert data["cause"] == "protocol-deadlock"
    assert data["culprit"]["label"] == "PP1 TP0"
    [pp1] = [r for r in data["ranks"] if r["label"] == "PP1 TP0"]
    assert pp1["wait_site"] == "ack-event-synchronize" and pp1["state"] == "blocked"
    assert not psutil.Process(os.getpid()).children(recursive=True)


def test_triage_of_the_form_c_scenario_names_pp1(tmp_path, capsys):
    """samples/scenarios/form_c.toml with a long hang timeout, so triage sees the live wedge:
    PP0 blocked sending a proxy PP1 never expects, PP1 waiting for requests (#34568)."""
    scenario = str(Path(__file__).resolve().parents[2] / "samples/scenarios/form_c.toml")
    run = _start_run(tmp_path, "--scenario", scenario, "--hang-timeout", "120")
    try:
        _wait_for_ranks(run, 2)
        _wait_for_wedge(tmp_path / "run", 2)
        code, data = _triage(capsys, run.pid)
    finally:
        _stop(run)
    assert (code, data["kind"], data["cause"]) == (12, "hang", "protocol-deadlock")
    assert data["culprit"]["label"] == "PP1 TP0"
    assert not psutil.Process(os.getpid()).children(recursive=True)


def test_triage_of_a_healthy_busy_run_says_so(tmp_path, capsys):
    run = _start_run(tmp_path, "--pp", "2", "--requests", "4000", "--max-new-tokens", "16")
    try:
        _wait_for_ranks(run, 2)
        _wait_for_steps(tmp_path / "run", 20)  # stepping: triage sees a busy run
        code, data = _triage(capsys, run.pid)
        still_running = run.poll() is None
    finally:
        _stop(run)
    assert still_running, "the run ended before triage looked at it"
    assert (code, data["kind"]) in {(0, "busy"), (0, "healthy")}, data["evidence"]
    assert not psutil.Process(os.getpid()).children(recursive=True)
