"""Real SGLang PP2 served across two sshd "nodes" (`--nnodes 2 --node-rank i --dist-init-addr`,
each server in its node's namespaces), PP1's scheduler SIGSTOPped on node-2: `triage --live
--via ssh` says hang C, culprit node-2 PP1 TP0, within 10 s. Start-up is 1-5 minutes on a loaded
2-core box, so it is `slow` as well as `multinode`; skipped without an SGLang install."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import time

import pytest

from tests.cluster.sglang_nodes import launch, schedulers
from tests.cluster.test_ssh_stopped_rank import triage

pytestmark = [pytest.mark.multinode, pytest.mark.slow, pytest.mark.process]


def test_real_sglang_pp2_across_two_nodes_stopped_pp1(ssh_cluster):
    if importlib.util.find_spec("sglang") is None:  # never imported here: it needs its shims
        pytest.skip("real SGLang not installed (python -m hicache_diag.engines.sglang.install)")
    procs = launch(ssh_cluster, ssh_cluster.root / "sglang")
    pids = schedulers(ssh_cluster, procs, timeout=480)
    time.sleep(2)  # past start-up: both event loops running
    os.kill(pids[1], signal.SIGSTOP)
    done, took = triage(ssh_cluster, "--hosts", "node-1,node-2", "--json")
    assert done.returncode == 12, done.stderr
    report = json.loads(done.stdout)
    assert (report["kind"], report["form"]) == ("hang", "C")
    assert report["culprit"]["label"] == "node-2 PP1 TP0"
    assert sorted(r["label"] for r in report["ranks"]) == ["node-1 PP0 TP0", "node-2 PP1 TP0"]
    assert took < 10, f"{took:.1f} s"
