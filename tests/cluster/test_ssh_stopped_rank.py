"""The default-run multi-node case: `triage --live --via ssh` over two real sshd nodes, PP1's
scheduler SIGSTOPped on node-2 -> hang, form C, culprit node-2 PP1 TP0, in seconds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.cluster.sshd import scheduler_pid

pytestmark = pytest.mark.process


def triage(cluster, *extra: str, timeout: float = 60) -> tuple[subprocess.CompletedProcess, float]:
    cmd = [sys.executable, "-m", "hicache_diag.cli.main", "triage", "--live", "--via", "ssh"]
    cmd += ["--ssh-config", str(cluster.client_config), *extra]
    t0 = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return done, time.monotonic() - t0


def test_stopped_pp1_on_node_2_is_the_culprit(pp2_job):
    cluster, procs = pp2_job
    os.kill(scheduler_pid(procs[1]), signal.SIGSTOP)
    done, took = triage(cluster, "--hosts", "node-1,node-2", "--json")
    assert done.returncode == 12, done.stderr
    report = json.loads(done.stdout)
    assert (report["kind"], report["form"]) == ("hang", "C")
    assert report["culprit"]["label"] == "node-2 PP1 TP0"
    labels = sorted(r["label"] for r in report["ranks"])
    assert labels == ["node-1 PP0 TP0", "node-2 PP1 TP0"]  # each node saw only its own
    assert report["nodes"]["missing"] == {}
    assert 0 <= report["nodes"]["skew_s"] < 3.0  # measured from the nodes' own instants
    assert took < 10, f"triage took {took:.1f} s"
