"""The warm trial server: real forks of a real server process, each a bisect_child calling the
stand-in trial function on its plan."""

import json
import os
import time
from pathlib import Path

import psutil
import pytest

from hicache_diag.trials.bisect_child import TrialPlan
from hicache_diag.trials.bisect_trials import kill_group
from hicache_diag.trials.trial_server import TrialServer
from tests.unit.trials.fake_run import FAKE_TRIAL, ROOT, FakeConfig


def _start(tmp_path: Path) -> TrialServer:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    server = TrialServer.start(tmp_path / "server.log", env)
    assert server is not None, (tmp_path / "server.log").read_text()
    return server


@pytest.fixture
def server(no_leftover_processes, tmp_path):
    srv = _start(tmp_path / "server")
    yield srv
    srv.close()
    assert srv.proc.returncode == 0


def _submit(server: TrialServer, tmp_path: Path, name: str, *extra: str):
    out = str(tmp_path / name)
    argv = ("hicache-diag", "run", "--out", out, "--seed", "2", "--protocol", "legacy", *extra)
    plan = tmp_path / f"{name}.plan"
    TrialPlan(FAKE_TRIAL, FakeConfig(seed=2, out=out), argv).save(plan)
    trial = server.submit([str(plan)], tmp_path / f"{name}.log")
    assert trial is not None and trial.pid > 0
    return trial


def _inner_pid(run_dir: Path) -> int:
    deadline = time.monotonic() + 20
    while not (run_dir / "pid").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return int((run_dir / "pid").read_text())


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.process
def test_a_trial_exits_with_its_verdicts_code_or_2_on_bad_input(server, tmp_path):
    trial = _submit(server, tmp_path, "t")
    assert trial.wait(30) == 10  # the stand-in's form A, as the verdict's exit code
    assert json.loads((tmp_path / "t" / "verdict.json").read_text())["form"] == "A"
    trial = _submit(server, tmp_path, "bad", "--bad")  # refused input: exit 2, one line
    assert trial.wait(30) == 2
    last = (tmp_path / "bad.log").read_text().strip().splitlines()[-1]
    assert last == "hicache-diag: error: unknown fault 'nope'; valid: dma-delay"


@pytest.mark.process
def test_a_trial_is_its_own_session_and_dies_whole(server, tmp_path):
    trial = _submit(server, tmp_path, "s", "--sleep")
    inner = _inner_pid(tmp_path / "s")
    # the run is a child of the trial's session leader, in the leader's group, not the server's
    assert os.getsid(inner) == os.getpgid(inner) == trial.pid
    assert os.getpgid(server.proc.pid) != trial.pid
    kill_group(trial)  # what bisect does on timeout and Ctrl-C: SIGINT the group, then SIGKILL
    assert trial.wait(10) != 0
    assert not _alive(inner) and not _alive(trial.pid)


@pytest.mark.process
def test_closing_the_server_kills_the_trials_still_running(tmp_path, no_leftover_processes):
    server = _start(tmp_path)
    trial = _submit(server, tmp_path, "s", "--sleep")
    inner = _inner_pid(tmp_path / "s")
    server.close()
    assert server.proc.returncode == 0 and trial.wait(10) == -1  # nobody reported an exit code
    assert not _alive(inner) and not _alive(trial.pid)
    # SIGTERM came first: the trial had the chance to reap its engine (a SIGKILLed one cannot).
    assert (tmp_path / "s" / "reaped").exists()
    assert server.submit(["--help"], tmp_path / "late.log") is None
