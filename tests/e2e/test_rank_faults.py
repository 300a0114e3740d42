"""A rank killed or stopped by someone else, at a random moment: the verdict names that rank
from process facts (exit 16 for a signal death, 12 for a stopped rank), the survivors' gloo
errors are the cascade, and no process is left behind. The moment is chosen in steps and
reached by polling the rank's jsonl, never by a fixed sleep.

The loops (20 kills, 10 stops) are slow; one kill and one stop run by default.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from tests.conftest import assert_no_children

CLI = [sys.executable, "-m", "hicache_diag.cli.main", "run"]
# The default run takes ~200 steps per rank; a moment is a step count (0: before the first).
MAX_STEP = 150


@dataclass
class Outcome:
    code: int
    verdict: dict
    seconds_to_verdict: float  # from the signal to the CLI's exit
    rank_pids: list[int]


def _lines(path: Path) -> int:
    try:
        with open(path, "rb") as fh:
            return sum(1 for _ in fh)
    except OSError:
        return 0


def _rank_process(cli: subprocess.Popen, rank: int, timeout: float = 60) -> psutil.Process:
    title, deadline = f"hicache-diag::scheduler_PP{rank}_TP0", time.time() + timeout
    while time.time() < deadline:
        assert cli.poll() is None, f"the run ended early: {cli.communicate()[1][-2000:]}"
        for p in psutil.Process(cli.pid).children(recursive=True):
            try:
                if " ".join(p.cmdline()).startswith(title):
                    return p
            except psutil.Error:
                continue
        time.sleep(0.01)
    raise AssertionError(f"no process titled {title}")


def _wait_for_step(out: Path, rank: int, step: int, cli: subprocess.Popen) -> bool:
    """Poll rank{r}.jsonl until it holds `step` lines; False if the run ended first."""
    path = out / f"rank{rank}.jsonl"
    while _lines(path) < step:
        if cli.poll() is not None:
            return False
        time.sleep(0.005)
    return True


def signal_rank(tmp_path: Path, sig: int, rank: int, step: int, *extra: str) -> Outcome | None:
    """Start a default run, send `sig` to `rank` once it has written `step` lines; None when
    the run finished before that moment (not a trial)."""
    n = sum(1 for _ in tmp_path.iterdir())  # a fresh run dir each time: --out is written once
    out = tmp_path / f"run{n}-sig{sig}-rank{rank}-step{step}"
    cli = subprocess.Popen(
        [*CLI, "--out", str(out), "--json", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        target = _rank_process(cli, rank)
        pids = [p.pid for p in psutil.Process(cli.pid).children(recursive=True)]
        if not _wait_for_step(out, rank, step, cli):
            cli.communicate(timeout=120)
            return None
        sent = time.time()
        target.send_signal(sig)
        stdout, stderr = cli.communicate(timeout=120)
        took = time.time() - sent
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    assert stdout.strip(), stderr[-2000:]
    return Outcome(cli.returncode, json.loads(stdout), took, pids)


def _assert_reaped(pids: list[int]) -> None:
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    assert not alive, f"rank processes left behind: {alive}"
    assert_no_children()


def check_kill(tmp_path: Path, rank: int, step: int) -> Outcome | None:
    got = signal_rank(tmp_path, signal.SIGKILL, rank, step)
    if got is None:
        return None
    v = got.verdict
    assert (got.code, v["outcome"], v["form"]) == (16, "crash", None), v
    assert (v["failed_rank"], v["culprit_rank"]) == (rank, rank), v
    assert "SIGKILL" in v["signature"], v["signature"]
    cascade = [line for line in v["evidence"] if "Connection closed" in line]
    assert all("secondary (cascade)" in line for line in cascade), cascade
    _assert_reaped(got.rank_pids)
    return got


def check_stop(tmp_path: Path, rank: int, step: int) -> Outcome | None:
    got = signal_rank(tmp_path, signal.SIGSTOP, rank, step, "--hang-timeout", "2")
    if got is None:
        return None
    v = got.verdict
    assert (got.code, v["outcome"], v["form"]) == (12, "hang", "C"), v
    assert (v["failed_rank"], v["culprit_rank"]) == (rank, rank), v
    assert any(f"rank {rank} was stopped" in line for line in v["evidence"]), v["evidence"]
    _assert_reaped(got.rank_pids)
    return got


def test_a_sigkilled_rank_is_named_exit_16(tmp_path):
    assert check_kill(tmp_path, rank=1, step=40) is not None


def test_a_stopped_rank_is_the_hang_culprit(tmp_path):
    assert check_stop(tmp_path, rank=0, step=40) is not None


def test_a_rank_stopped_before_its_first_step_hangs_after_the_timeout_not_the_grace(tmp_path):
    got = check_stop(tmp_path, rank=1, step=0)
    assert got is not None
    assert got.seconds_to_verdict < 15, "the 15 s start-up grace must not apply to a stopped rank"


def _loop(tmp_path: Path, check, runs: int, seed: int) -> list[Outcome]:
    rng, done = random.Random(seed), []
    while len(done) < runs:
        i = len(done)
        got = check(tmp_path, rank=i % 2, step=rng.randint(0, MAX_STEP))
        if got is not None:
            done.append(got)
    times = sorted(round(o.seconds_to_verdict, 1) for o in done)
    print(f"{runs} runs right; seconds from signal to verdict: {times}")
    return done


@pytest.mark.slow
def test_twenty_random_sigkills_each_name_the_killed_rank(tmp_path):
    _loop(tmp_path, check_kill, 20, seed=13)


@pytest.mark.slow
def test_ten_random_sigstops_each_name_the_stopped_rank(tmp_path):
    _loop(tmp_path, check_stop, 10, seed=31)


@pytest.mark.slow
def test_the_documented_stall_example_names_rank_1(tmp_path):
    out = tmp_path / "run"
    spec = "rank-stall:rank=1,ms=8000,after=15,until=15"
    proc = subprocess.run(
        [*CLI, "--fault", spec, "--out", str(out), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    v = json.loads(proc.stdout)
    assert (proc.returncode, v["outcome"], v["failed_rank"], v["culprit_rank"]) == (
        12,
        "hang",
        1,
        1,
    ), v
    assert f"faults injected: {spec}" in v["evidence"]
    assert_no_children()
