"""Multi-node faults through real sshd nodes (-m multinode): a node down, an unknown host, a
refused key, a host that hangs, no python3, no py-spy, a collector killed halfway, Ctrl-C;
and the saved bundle read back with --dumps."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import psutil
import pytest

from tests.cluster.sshd import client_config, scheduler_pid, start_cluster, start_pp_job
from tests.cluster.test_ssh_stopped_rank import triage

pytestmark = [pytest.mark.multinode, pytest.mark.process]
MARKER = "--hicache-diag-collector"


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:
        return []


def _leftovers(cluster) -> list[list[str]]:
    """Collectors and their py-spy children on the nodes (inside the nodes' namespaces), and
    our ssh clients here."""
    found = []
    for node in cluster.nodes:
        try:
            inside = psutil.Process(node.init_pid()).children(recursive=True)
        except (IndexError, psutil.Error):
            continue
        found += [c for p in inside if MARKER in (c := _cmdline(p)) or "dump" in c]
    ours = [_cmdline(p) for p in psutil.process_iter()]
    return found + [c for c in ours if c[:1] == ["ssh"] and str(cluster.client_config) in c]


def _assert_nothing_left(cluster, timeout: float = 3.0) -> None:
    end = time.monotonic() + timeout
    while _leftovers(cluster) and time.monotonic() < end:
        time.sleep(0.1)
    assert not _leftovers(cluster)


def test_node_with_sshd_down_is_missing_and_never_blamed(pp2_job):
    cluster, procs = pp2_job
    os.kill(scheduler_pid(procs[1]), signal.SIGSTOP)
    cluster.node("node-2").stop_sshd()  # the node's ranks still run; nobody can log in
    done, _ = triage(cluster, "--hosts", "node-1,node-2", "--json")
    report = json.loads(done.stdout)
    assert list(report["nodes"]["missing"]) == ["node-2"]
    assert "connection refused" in report["nodes"]["missing"]["node-2"]
    assert [r["label"] for r in report["ranks"]] == ["node-1 PP0 TP0"]
    culprit = report["culprit"]
    assert culprit is None or not culprit["label"].startswith("node-2")
    assert any("node node-2 did not answer" in e for e in report["evidence"])
    assert report["confidence"] != "high"


def test_unknown_host_alone_is_exit_2_and_beside_a_node_is_missing(pp2_job):
    cluster, _ = pp2_job
    done, _ = triage(cluster, "--hosts", "nosuch.invalid")
    assert done.returncode == 2
    assert "nosuch.invalid: ssh nosuch.invalid: unknown host" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    done, _ = triage(cluster, "--hosts", "node-1,nosuch.invalid", "--json")
    assert "unknown host" in json.loads(done.stdout)["nodes"]["missing"]["nosuch.invalid"]


def test_refused_key_is_exit_2(ssh_cluster, tmp_path):
    key = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    ssh_cluster.client_config = client_config(ssh_cluster.root, ssh_cluster.nodes, key)
    done, _ = triage(ssh_cluster, "--hosts", "node-1,node-2")
    assert done.returncode == 2
    assert "key refused" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_host_that_hangs_is_missing_after_the_host_timeout(pp2_job):
    cluster, _ = pp2_job
    silent = socket.create_server(("127.0.0.9", 0))  # accepts, never says a word
    port = silent.getsockname()[1]
    conns = []
    threading.Thread(target=lambda: conns.append(silent.accept()), daemon=True).start()
    cfg = cluster.client_config
    cfg.write_text(cfg.read_text() + f"Host stuck\n  HostName 127.0.0.9\n  Port {port}\n")
    try:
        done, took = triage(cluster, "--hosts", "node-1,stuck", "--host-timeout", "4", "--json")
    finally:
        silent.close()
    report = json.loads(done.stdout)
    assert "no answer within 4 s" in report["nodes"]["missing"]["stuck"]
    assert [r["label"] for r in report["ranks"]] == ["node-1 PP0 TP0"]
    assert took < 10
    _assert_nothing_left(cluster)


def test_node_without_python3_is_exit_2(tmp_path):
    cluster = start_cluster(tmp_path, count=1, path="/nonexistent")
    try:
        done, _ = triage(cluster, "--hosts", "node-1")
    finally:
        cluster.stop()
    assert done.returncode == 2
    assert "no python3 on the node" in done.stderr


def test_node_without_pyspy_falls_back_to_proc_and_still_finds_the_stopped_rank(tmp_path):
    cluster = start_cluster(tmp_path, path="/usr/bin:/bin")  # the system python3, no py-spy
    try:
        procs = start_pp_job(cluster)
        os.kill(scheduler_pid(procs[1]), signal.SIGSTOP)
        done, _ = triage(cluster, "--hosts", "node-1,node-2", "--json")
    finally:
        cluster.stop()
    report = json.loads(done.stdout)
    assert report["culprit"]["label"] == "node-2 PP1 TP0"
    chain = next(e for e in report["evidence"] if e.startswith("node-2 PP1 TP0 (pid"))
    assert "py-spy --nonblocking failed: not installed" in chain
    assert "pystack failed: not installed" in chain and "/proc ok" in chain


def _start_slow_triage(cluster, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "hicache_diag.cli.main", "triage", "--live", "--via", "ssh"]
    cmd += ["--ssh-config", str(cluster.client_config), "--hosts", "node-1,node-2"]
    cmd += ["--samples", "2", "--interval", "6", "--json", *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_collectors(cluster, timeout: float = 10.0) -> dict[str, psutil.Process]:
    """node name -> its running collector (host pid)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = {}
        for node in cluster.nodes:
            for p in psutil.Process(node.init_pid()).children(recursive=True):
                if MARKER in _cmdline(p):
                    found[node.name] = p
        if len(found) == len(cluster.nodes):
            return found
        time.sleep(0.1)
    raise AssertionError("the collectors never started")


def test_collector_killed_halfway_names_its_node_missing(pp2_job):
    cluster, _ = pp2_job
    proc = _start_slow_triage(cluster)
    _wait_collectors(cluster)["node-2"].kill()
    out, err = proc.communicate(timeout=30)
    report = json.loads(out)
    assert "node-2" in report["nodes"]["missing"]
    assert [r["label"] for r in report["ranks"]] == ["node-1 PP0 TP0"]
    _assert_nothing_left(cluster)


def test_ctrl_c_leaves_nothing_running_on_any_node(pp2_job):
    cluster, _ = pp2_job
    proc = _start_slow_triage(cluster)
    _wait_collectors(cluster)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=15)
    assert proc.returncode == 130
    _assert_nothing_left(cluster)


def test_saved_bundle_reads_back_with_dumps_to_the_same_verdict(pp2_job, tmp_path):
    cluster, procs = pp2_job
    os.kill(scheduler_pid(procs[1]), signal.SIGSTOP)
    bundle = tmp_path / "bundle"
    done, _ = triage(cluster, "--hosts", "node-1,node-2", "--save", str(bundle), "--json")
    assert done.returncode == 12, done.stderr
    live = json.loads(done.stdout)
    cmd = [sys.executable, "-m", "hicache_diag.cli.main", "triage", "--dumps", str(bundle)]
    again = subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=60)
    assert again.returncode == 12, again.stderr
    report = json.loads(again.stdout)
    assert report["culprit"]["label"] == live["culprit"]["label"] == "node-2 PP1 TP0"
    assert (report["kind"], report["form"]) == ("hang", "C")
    assert json.loads((bundle / "cluster.json").read_text())["answered"] == ["node-1", "node-2"]
    # The envelopes alone (what a merge with other dumps reads) keep the node in every label.
    (bundle / "cluster.json").unlink()
    plain = subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=60)
    labels = sorted(r["label"] for r in json.loads(plain.stdout)["ranks"])
    assert labels == ["node-1 PP0 TP0", "node-2 PP1 TP0"]
