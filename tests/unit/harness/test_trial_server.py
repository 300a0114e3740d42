"""The warm trial server: real forks of a real server process, running the stand-in `run`."""

import json
import os
import time
from pathlib import Path

import psutil
import pytest

from hicache_diag.harness.bisect_trials import kill_group
from hicache_diag.harness.trial_server import TrialServer

HERE = Path(__file__).parent


def _start(tmp_path: Path) -> TrialServer:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
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
    args = ["--out", str(tmp_path / name), "--seed", "2", "--protocol", "legacy", "--json", *extra]
    trial = server.submit(args, tmp_path / f"{name}.log", module="fake_run")
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
def test_a_trial_reports_its_exit_code_and_output(server, tmp_path):
    trial = _submit(server, tmp_path, "t")
    out, err = trial.communicate(timeout=30)
    assert trial.returncode == 10  # the stand-in's form A
    assert json.loads(out.strip().splitlines()[-1])["form"] == "A" and err == out


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
    assert server.submit(["--help"], tmp_path / "late.log") is None
