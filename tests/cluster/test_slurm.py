"""`triage --live --via slurm` inside a running job of a real slurmctld + two slurmd (each in
its own PID namespace): PP1's scheduler on sl-2 SIGSTOPped -> hang C, culprit sl-2 PP1 TP0;
a job that is not running, or no such job: exit 2 in one line (-m multinode)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.cluster.slurm import start_slurm, submit_pp_job
from tests.cluster.sshd import TESTS

pytestmark = [pytest.mark.multinode, pytest.mark.process]


@pytest.fixture
def slurm(tmp_path):
    cluster = start_slurm(tmp_path, ["sl-1", "sl-2"])
    yield cluster
    cluster.stop()


def _schedulers(port: int, count: int, timeout: float = 30.0) -> dict[int, int]:
    """pp -> host pid of the titled schedulers whose launcher carries `--port PORT`."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = {}
        for proc in psutil.process_iter(["cmdline"]):
            cmd = proc.info["cmdline"] or []
            if cmd[:1] and cmd[0].startswith("sglang::scheduler_PP"):
                try:
                    parent = proc.parent().cmdline()
                except (psutil.Error, AttributeError):
                    continue
                if "--port" in parent and parent[parent.index("--port") + 1] == str(port):
                    found[int(cmd[0].split("_PP")[1].split("_")[0])] = proc.pid
        if len(found) == count:
            return found
        time.sleep(0.2)
    raise AssertionError(f"the job's schedulers never appeared: {found}")


def _triage(slurm, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "hicache_diag.cli.main", "triage", "--live", "--via", "slurm"]
    return subprocess.run([*cmd, *args], env=slurm.env, capture_output=True, text=True, timeout=60)


def test_stopped_pp1_on_sl_2_is_the_culprit_through_srun(slurm):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    job = submit_pp_job(slurm, TESTS / "fake_rank.py", port)
    pids = _schedulers(port, 2)
    time.sleep(0.5)  # PP1 connected to PP0
    os.kill(pids[1], signal.SIGSTOP)
    t0 = time.monotonic()
    done = _triage(slurm, "--jobid", job, "--json")
    took = time.monotonic() - t0
    assert done.returncode == 12, done.stderr
    report = json.loads(done.stdout)
    assert (report["kind"], report["form"]) == ("hang", "C")
    assert report["culprit"]["label"] == "sl-2 PP1 TP0"
    assert sorted(r["label"] for r in report["ranks"]) == ["sl-1 PP0 TP0", "sl-2 PP1 TP0"]
    assert took < 10, f"{took:.1f} s"
    os.kill(pids[1], signal.SIGCONT)
    slurm.run("scancel", job)


def test_job_not_running_or_missing_is_exit_2(slurm):
    done = _triage(slurm, "--jobid", "999999")
    assert done.returncode == 2 and "--jobid 999999" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    held = slurm.run("sbatch", "--parsable", "--hold", "--wrap", "sleep 30").stdout.strip()
    done = _triage(slurm, "--jobid", held)
    assert done.returncode == 2 and "pending, not running" in done.stderr


def test_bisect_via_slurm_runs_each_trial_as_a_job_step(slurm):
    out = slurm.root / "bisect"
    cmd = [sys.executable, "-m", "hicache_diag.cli.main", "bisect", "--storage-backend"]
    cmd += ["none,file", "--trials", "4", "--jobs", "4", "--via", "slurm", "--out", str(out)]
    kw = {"env": slurm.env, "capture_output": True, "text": True, "timeout": 900}
    done = subprocess.run([*cmd, "--json"], **kw)
    assert done.returncode == 0, done.stderr
    table = json.loads(done.stdout)
    assert [c["values"]["storage-backend"] for c in table["cells"]] == ["none", "file"]
    assert [(c["trials"], c["errors"]) for c in table["cells"]] == [(4, []), (4, [])]
    log = (slurm.root / "slurmctld.log").read_text()
    assert log.count("_slurm_rpc_allocate_resources") == 8  # one job (one step) per trial
    for cell in table["cells"]:
        for run_dir in cell["run_dirs"]:
            assert (Path(run_dir) / "verdict.json").is_file()  # read from the shared path


def _collector_steps() -> list[int]:
    marker = "--hicache-diag-collector"
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if marker in cmd and "--jobid" not in cmd:  # the node side (srun's own argv has --jobid)
            found.append(proc.pid)
    return found


def test_ctrl_c_ends_the_collector_steps(slurm):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    job = submit_pp_job(slurm, TESTS / "fake_rank.py", port)
    _schedulers(port, 2)
    cmd = [sys.executable, "-m", "hicache_diag.cli.main", "triage", "--live", "--via", "slurm"]
    cmd += ["--jobid", job, "--interval", "8", "--json"]
    proc = subprocess.Popen(cmd, env=slurm.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    end = time.monotonic() + 20
    while len(_collector_steps()) < 2 and time.monotonic() < end:
        time.sleep(0.2)
    assert len(_collector_steps()) == 2
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=20)
    assert proc.returncode == 130
    end = time.monotonic() + 5
    while _collector_steps() and time.monotonic() < end:
        time.sleep(0.2)
    assert not _collector_steps()
    slurm.run("scancel", job)
