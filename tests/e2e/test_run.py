"""`hicache-diag run` end to end: real rank processes, real gloo, every exit path reaped."""

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

from hicache_diag.trials.reference import compare_outputs
from tests.conftest import assert_no_children

CLI = [sys.executable, "-m", "hicache_diag.cli.main"]


def _run(args: list[str], timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "run", *args], capture_output=True, text=True, timeout=timeout)


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _check_healthy(out: Path, proc: subprocess.CompletedProcess, world: int) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    verdict = json.loads(proc.stdout)
    assert verdict["outcome"] == "ok", verdict
    outputs = json.loads((out / "outputs.json").read_text())
    reference = json.loads((out / "reference.json").read_text())
    assert set(outputs) == set(reference)
    assert compare_outputs(outputs, reference) == []
    steps = [[r["step"] for r in _lines(out / f"rank{r}.jsonl")] for r in range(world)]
    for s in steps:
        assert s == list(range(len(s))), "one line per step, no gaps"
    assert len({len(s) for s in steps}) == 1, "every rank ran the same number of steps"
    launcher = json.loads((out / "launcher.json").read_text())
    assert [r["state"] for r in launcher["ranks"]] == ["exited"] * world
    assert_no_children()
    return verdict


def test_default_run_shows_reuse_eviction_and_load_back_on_every_rank(tmp_path):
    """`hicache-diag run` with no flags is the README's demo: it must really show prefix
    reuse, eviction and host load-back, on every rank, and say so in its verdict."""
    out = tmp_path / "run"
    proc = _run(["--json", "--out", str(out)])
    verdict = _check_healthy(out, proc, 2)
    assert verdict["steps"] > 32
    for rank in (0, 1):
        rows = _lines(out / f"rank{rank}.jsonl")
        counts = verdict["cache"][str(rank)]
        assert counts["prefix_hit"] == sum(sum(r["prefix_len"].values()) for r in rows) > 0
        assert counts["host_hit"] == sum(sum(r["host_hit_len"].values()) for r in rows) > 0
        assert counts["evicted"] == sum(r["evicted"] for r in rows) > 0, "no eviction"
        assert counts["load_backs"] == sum(r["load_backs"] for r in rows) > 0, "no load-back"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "world"),
    [
        (["--pp", "1"], 1),
        (["--pp", "3"], 3),
        (["--pp", "2", "--tp", "2"], 4),
        (["--async-depth", "1"], 2),
        (["--pp", "3", "--async-depth", "2"], 3),
    ],
)
def test_topologies_are_healthy(tmp_path, args, world):
    out = tmp_path / "run"
    proc = _run([*args, "--requests", "32", "--seed", "7", "--json", "--out", str(out)])
    _check_healthy(out, proc, world)


def _start(out: Path, extra: list[str] = ()) -> subprocess.Popen:
    args = [
        "run",
        "--requests",
        "400",
        "--workload",
        "idle",
        "--seed",
        "1",
        "--out",
        str(out),
        "--json",
        *extra,
    ]
    return subprocess.Popen(
        [*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _wait_for_steps(out: Path, rank: int, steps: int, timeout: float = 90) -> None:
    path, deadline = out / f"rank{rank}.jsonl", time.time() + timeout
    while time.time() < deadline:
        if path.exists() and len(path.read_text().splitlines()) >= steps:
            return
        time.sleep(0.2)
    raise AssertionError(f"rank {rank} never reached step {steps}")


def _rank_process(cli_pid: int, title: str) -> psutil.Process:
    for p in psutil.Process(cli_pid).children(recursive=True):
        if " ".join(p.cmdline()).startswith(title):
            return p
    raise AssertionError(f"no process titled {title}")


def test_sigkill_of_one_rank_reaps_the_rest(tmp_path):
    out = tmp_path / "run"
    cli = _start(out)
    try:
        _wait_for_steps(out, 1, 5)
        victim = _rank_process(cli.pid, "hicache-diag::scheduler_PP1_TP0")
        victim.send_signal(signal.SIGKILL)
        stdout, stderr = cli.communicate(timeout=60)
    finally:
        cli.kill()
    assert cli.returncode == 16, stderr[-2000:]
    verdict = json.loads(stdout)
    assert verdict["outcome"] == "crash", verdict
    assert (verdict["failed_rank"], verdict["culprit_rank"]) == (1, 1), verdict
    launcher = json.loads((out / "launcher.json").read_text())
    assert launcher["first_failure"]["rank"] == 1
    by_rank = {r["rank"]: r for r in launcher["ranks"]}
    assert by_rank[1]["signal"] == signal.SIGKILL
    assert_no_children()


def test_ctrl_c_of_the_cli_reaps_every_rank(tmp_path):
    out = tmp_path / "run"
    cli = _start(out)
    try:
        _wait_for_steps(out, 0, 5)
        ranks = [p.pid for p in psutil.Process(cli.pid).children(recursive=True)]
        cli.send_signal(signal.SIGINT)
        _, stderr = cli.communicate(timeout=60)
    finally:
        cli.kill()
    assert cli.returncode == 130, stderr[-2000:]
    assert json.loads((out / "launcher.json").read_text())["interrupted"] is True
    verdict = json.loads((out / "verdict.json").read_text())
    assert (verdict["outcome"], verdict["exit_code"]) == ("interrupted", 130)
    assert not [
        pid
        for pid in ranks
        if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    ]
    assert_no_children()


def test_stalled_rank_is_a_hang_with_stacks(tmp_path):
    out = tmp_path / "run"
    proc = _run(
        [
            "--requests",
            "8",
            "--seed",
            "2",
            "--json",
            "--out",
            str(out),
            "--hang-timeout",
            "2",
            "--fault",
            "rank-stall:rank=1,ms=60000,after=6",
        ]
    )
    assert proc.returncode == 12, proc.stderr[-2000:]
    verdict = json.loads(proc.stdout)
    assert verdict["outcome"] == "hang" and verdict["form"] == "C"
    assert (verdict["failed_rank"], verdict["culprit_rank"]) == (1, 1), verdict
    launcher = json.loads((out / "launcher.json").read_text())
    assert launcher["hang"] is not None and launcher["stacks"]["tool"] in ("py-spy", "faulthandler")
    stacks = list((out / "stacks").iterdir())
    assert any(p.stat().st_size > 0 for p in stacks), "some stack dump must be captured"
    assert {r["state"] for r in launcher["ranks"]} == {"hung"}
    assert_no_children()


# Test-only: a sitecustomize that makes rank 1's scheduler raise at step 6 (a thread patches
# the class once the rank imports it), so the crash path is deterministic.
CRASHER = """
import os, sys, threading, time
def _patch():
    while "hicache_diag.engines.builtin.runtime.managers.scheduler" not in sys.modules:
        time.sleep(0.01)
    if "--rank" not in sys.argv or sys.argv[sys.argv.index("--rank") + 1] != "1":
        return
    from hicache_diag.engines.builtin.runtime.managers import scheduler as m
    orig = m.Scheduler.process_batch_result
    def boom(self, batch, ids):
        if self.step >= 6:
            raise RuntimeError("injected by the e2e test")
        return orig(self, batch, ids)
    m.Scheduler.process_batch_result = boom
if os.environ.get("HICACHE_DIAG_TEST_CRASH"):
    threading.Thread(target=_patch, daemon=True).start()
"""


def test_rank_exception_is_the_root_cause_with_its_traceback(tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(CRASHER)
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site"), "HICACHE_DIAG_TEST_CRASH": "1"}
    out = tmp_path / "run"
    proc = subprocess.run(
        [*CLI, "run", "--requests", "8", "--json", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    verdict = json.loads(proc.stdout)
    assert verdict["outcome"] == "crash" and verdict["failed_rank"] == 1, verdict
    assert "injected by the e2e test" in verdict["signature"]
    log = (out / "rank1.log").read_text()
    assert "Scheduler hit an exception: Traceback (most recent call last):" in log
    assert "run_scheduler_process" in log and "[" in log.splitlines()[0]
    launcher = json.loads((out / "launcher.json").read_text())
    assert launcher["first_failure"]["rank"] == 1
    states = {r["rank"]: r["state"] for r in launcher["ranks"]}
    assert states[1] == "crashed" and states[0] in ("crashed", "killed")
    assert_no_children()


def test_ranks_die_with_a_sigkilled_launcher(tmp_path):
    """PR_SET_PDEATHSIG: even a launcher that cannot reap (SIGKILL) takes its ranks along."""
    out = tmp_path / "run"
    cli = _start(out)
    try:
        _wait_for_steps(out, 0, 3)
        ranks = list(psutil.Process(cli.pid).children(recursive=True))
        os.kill(cli.pid, signal.SIGKILL)
        cli.wait(timeout=30)
        gone, alive = psutil.wait_procs(ranks, timeout=15)
    finally:
        cli.kill()
    assert not alive, [p.pid for p in alive]


@pytest.mark.slow
def test_ranks_start_under_torchrun(tmp_path):
    """Multi-node runs use torchrun (env://); the rank entry reads the run dir's manifest."""
    import socket

    seed_run = tmp_path / "seed"
    _check_healthy(seed_run, _run(["--requests", "4", "--json", "--out", str(seed_run)]), 2)
    out = tmp_path / "torchrun"
    (out / "stacks").mkdir(parents=True)
    (out / "manifest.json").write_text((seed_run / "manifest.json").read_text())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-port",
        str(port),
        "-m",
        "hicache_diag.engines.builtin.rank_main",
        "--run-dir",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((out / "outputs.json").read_text()) == json.loads(
        (seed_run / "outputs.json").read_text()
    )
    assert_no_children()


def test_ctrl_c_of_a_stalled_run_names_the_rank_that_stopped_stepping(tmp_path):
    out = tmp_path / "run"
    args = [
        "run",
        "--hang-timeout",
        "60",
        "--out",
        str(out),
        "--json",
        "--fault",
        "rank-stall:rank=1,ms=30000,after=15,until=15",
    ]  # the default 32-request demo
    cli = subprocess.Popen([*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_steps(out, 1, 15)
        time.sleep(3)  # past the 1 s the trial needs to call it a stall, far from the timeout
        cli.send_signal(signal.SIGINT)
        stdout, stderr = cli.communicate(timeout=60)
    finally:
        cli.kill()
    assert cli.returncode == 130, stderr[-2000:]
    verdict = json.loads(stdout)
    assert verdict["outcome"] == "interrupted" and verdict["culprit_rank"] is None, verdict
    assert "rank 1 had stopped stepping" in verdict["signature"], verdict
    assert json.loads((out / "launcher.json").read_text())["interrupt_stall"]["stalled_ranks"]
    assert_no_children()
