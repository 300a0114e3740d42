"""`bisect --via ssh --hosts node-1,node-2`: every trial on a free host of two real sshd nodes
(tests/cluster/sshd.py, each in its own PID namespace), builtin engine, its run dir on the
shared path; the table the local one. A trial killed on its host is `undecided`, named as lost,
never a pass; an unknown host is one line, exit 2, before any trial."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

pytestmark = [pytest.mark.multinode, pytest.mark.process]

CHILD = "hicache_diag.trials.bisect_child"


def _bisect(cluster, out: Path, hosts: str, trials: int = 2, timeout: float = 600, *extra):
    cmd = [sys.executable, "-m", "hicache_diag.cli.main", "bisect", "--storage-backend"]
    cmd += ["none,file", "--trials", str(trials), "--via", "ssh", "--hosts", hosts, *extra]
    cmd += ["--ssh-config", str(cluster.client_config), "--out", str(out), "--json"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def _on_node(node, pid: int) -> bool:
    """Whether `pid` lives in `node`'s namespaces (a descendant of its init)."""
    try:
        return any(p.pid == node.init_pid() for p in psutil.Process(pid).parents())
    except psutil.Error:
        return False


def test_bisect_via_ssh_runs_each_trial_on_a_free_host(ssh_cluster):
    out = ssh_cluster.root / "bisect"
    t0 = time.monotonic()
    done = _bisect(ssh_cluster, out, "node-1,node-2")
    took = time.monotonic() - t0
    assert done.returncode == 0, done.stderr[-2000:]
    table = json.loads(done.stdout)
    assert [c["values"]["storage-backend"] for c in table["cells"]] == ["none", "file"]
    assert [(c["trials"], c["undecided"], c["errors"]) for c in table["cells"]] == [
        (2, 0, []),
        (2, 0, []),
    ]
    hosts = []
    for cell in table["cells"]:
        for run_dir in cell["run_dirs"]:
            assert (Path(run_dir) / "verdict.json").is_file()  # read from the shared path
            log = Path(f"{run_dir}.log").read_text()
            hosts += [h for h in ("node-1", "node-2") if f"trial on {h} (ssh)" in log]
    assert sorted(set(hosts)) == ["node-1", "node-2"] and len(hosts) == 4, hosts
    print(f"bisect --via ssh, 2 cells x 2 trials on 2 hosts: {took:.1f} s")


def test_a_trial_killed_on_its_host_is_undecided_and_named_lost(ssh_cluster):
    node = ssh_cluster.node("node-2")
    killed: list[int] = []

    def kill_first_trial() -> None:  # the trial process itself, on node-2, mid-run
        end = time.monotonic() + 300
        while not killed and time.monotonic() < end:
            for proc in psutil.process_iter(["cmdline"]):
                cmd = proc.info["cmdline"] or []
                if cmd[1:3] == ["-m", CHILD] and _on_node(node, proc.pid):
                    proc.send_signal(signal.SIGKILL)
                    killed.append(proc.pid)
                    break
            time.sleep(0.1)

    killer = threading.Thread(target=kill_first_trial, daemon=True)
    killer.start()
    done = _bisect(ssh_cluster, ssh_cluster.root / "bisect", "node-2", trials=1)
    killer.join(5)
    assert killed, "no trial process was seen on node-2"
    assert done.returncode == 0, done.stderr[-2000:]
    table = json.loads(done.stdout)
    first = table["cells"][0]
    assert (first["trials"], first["undecided"], first["failures"]) == (0, 1, 0)  # never a pass
    assert "trial lost on node-2" in first["errors"][0], first["errors"]
    assert "exit status 137" in first["errors"][0], first["errors"]
    assert table["cells"][1]["trials"] == 1  # the host is free again for the next trial


def test_a_trial_timed_out_here_leaves_nothing_on_its_host(ssh_cluster):
    out = ssh_cluster.root / "bisect"
    done = _bisect(ssh_cluster, out, "node-1,node-2", 1, 300, "--trial-timeout", "2")
    assert done.returncode == 3, done.stderr[-2000:]  # no trial finished: nothing concluded
    table = json.loads(done.stdout)
    assert [(c["trials"], c["undecided"]) for c in table["cells"]] == [(0, 1), (0, 1)]
    time.sleep(2)  # the hosts' lifelines see the connections end
    left = [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if CHILD in (p.info["cmdline"] or []) and any(_on_node(n, p.pid) for n in ssh_cluster.nodes)
    ]
    assert not left, "a trial outlived its ssh connection"


def test_an_unknown_host_is_one_line_before_any_trial(ssh_cluster):
    out = ssh_cluster.root / "bisect"
    done = _bisect(ssh_cluster, out, "node-1,nope", timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "ssh nope: unknown host" in lines[0], done.stderr
    assert not list(out.glob("cell*")), "no trial may start"


def test_a_host_whose_sshd_is_down_is_one_line_before_any_trial(ssh_cluster):
    ssh_cluster.node("node-2").stop_sshd()
    done = _bisect(ssh_cluster, ssh_cluster.root / "bisect", "node-1,node-2", timeout=60)
    assert done.returncode == 2, done.stderr
    assert "ssh node-2: connection refused" in done.stderr.strip(), done.stderr
