"""`run --engine sglang --nnodes 2 --hosts 127.0.0.2,127.0.0.3 --ssh-config CFG`: real SGLang
0.5.23 PP2, node i started through ssh on the i-th sshd "host" (tests/cluster/sshd.py: each in
its own PID and mount namespace), the 0.5.23 form-B scenario. The verdict is the single-node
one (crash B, culprit rank 1, exit 11), naming node-1 on 127.0.0.3; the remote path was used:
the ranks' facts came through the collector over ssh and their pids are the namespaces' own
(this machine's pids are past 10,000; a fresh namespace's are small). After the command no
SGLang process is left in either namespace. Start-up is minutes on a loaded 2-core box, so it
is `slow` as well as `multinode`; skipped without an SGLang install."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.cluster.sshd import SshCluster

pytestmark = [pytest.mark.multinode, pytest.mark.slow, pytest.mark.process]

ROOT = Path(__file__).resolve().parents[2]
FORM_B = ROOT / "samples" / "scenarios" / "sglang" / "form_b_host_alloc_0.5.23.toml"


def _config_by_address(cluster: SshCluster) -> Path:
    """An ssh config whose host names are the nodes' addresses (their sshd's own port)."""
    common = cluster.client_config.read_text().split("Host *", 1)[1]  # user, key, no checks
    text = "".join(
        f"Host {n.address}\n  HostName {n.address}\n  Port {n.port}\n" for n in cluster.nodes
    )
    path = cluster.root / "ssh_config_by_address"
    path.write_text(text + "Host *" + common)
    return path


def _sglang_left(cluster: SshCluster) -> list[str]:
    """SGLang processes still in any node's namespace (all descend from its init)."""
    left = []
    for node in cluster.nodes:
        for p in psutil.Process(node.init_pid()).children(recursive=True):
            try:
                cmd = " ".join(p.cmdline())
            except psutil.Error:
                continue
            if "sglang" in cmd and p.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{node.address}: {p.pid} {cmd[:80]}")
    return left


def test_run_hosts_form_b_names_node_1_on_its_host(ssh_cluster, tmp_path):
    if importlib.util.find_spec("sglang") is None:  # never imported here: it needs its shims
        pytest.skip("real SGLang not installed (python -m hicache_diag.engines.sglang.install)")
    config = _config_by_address(ssh_cluster)
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "hicache_diag.cli.main", "run", "--engine", "sglang"]
    cmd += ["--nnodes", "2", "--hosts", "127.0.0.2,127.0.0.3", "--ssh-config", str(config)]
    cmd += ["--scenario", str(FORM_B), "--out", str(run_dir), "--json"]
    env = {**os.environ, "HICACHE_DIAG_SGLANG_READY_TIMEOUT": "600"}
    t0 = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1500, env=env)
    took = time.monotonic() - t0
    assert done.returncode == 11, f"{took:.0f} s\n{done.stderr[-3000:]}"
    verdict = json.loads(done.stdout)
    assert (verdict["outcome"], verdict["form"], verdict["culprit_rank"]) == ("crash", "B", 1)
    ranks = {r["rank"]: (r["node"], r["host"], r["pp"]) for r in verdict["ranks"]}
    assert ranks == {0: ("node-0", "127.0.0.2", 0), 1: ("node-1", "127.0.0.3", 1)}
    want = "across 2 nodes (--nnodes, ssh: 127.0.0.2,127.0.0.3)"
    assert any(want in line for line in verdict["evidence"]), verdict["evidence"]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert [(n["node"], n["host"]) for n in manifest["sglang"]["nodes"]] == [
        ("node-0", "127.0.0.2"),
        ("node-1", "127.0.0.3"),
    ]
    launcher = json.loads((run_dir / "launcher.json").read_text())
    for rank in launcher["ranks"]:
        assert rank["seen_by"] == "collector.py over ssh", rank
        assert rank["pid"] < 1000, f"{rank['pid']} is not a fresh namespace's pid"
    nodes = launcher["nodes"]
    assert nodes["node-1"]["host"] == "127.0.0.3" and nodes["node-1"]["lost"] is None
    assert {n["schedulers_left"] for n in nodes.values()} <= {0, None}
    assert not _sglang_left(ssh_cluster), "a node's SGLang outlived the run"
    print(f"run --hosts form B: {took:.0f} s")


def _busy_steps(path: Path) -> int:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return 0
    return sum(1 for ln in lines if ln.startswith("{") and not json.loads(ln).get("idle"))


def _stop_pp1(cluster: SshCluster) -> int:
    """SIGSTOP PP1's scheduler inside the second host's namespace; its host pid."""
    node = cluster.nodes[1]
    for p in psutil.Process(node.init_pid()).children(recursive=True):
        if (p.cmdline() or [""])[0].startswith("sglang::scheduler_PP1"):
            p.suspend()
            return p.pid
    raise AssertionError("no PP1 scheduler on 127.0.0.3")


def test_run_hosts_stopped_pp1_on_node_1_is_hang_c(ssh_cluster, tmp_path):
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("real SGLang not installed (python -m hicache_diag.engines.sglang.install)")
    config = _config_by_address(ssh_cluster)
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "hicache_diag.cli.main", "run", "--engine", "sglang"]
    cmd += ["--nnodes", "2", "--pp", "2", "--hosts", "127.0.0.2,127.0.0.3"]
    cmd += ["--ssh-config", str(config), "--requests", "400", "--hang-timeout", "20"]
    cmd += ["--out", str(run_dir), "--json"]
    env = {**os.environ, "HICACHE_DIAG_SGLANG_READY_TIMEOUT": "600"}
    t0 = time.monotonic()
    with open(tmp_path / "stderr.txt", "w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        try:
            while _busy_steps(run_dir / "rank1.jsonl") < 20:  # serving the workload
                assert proc.poll() is None, (tmp_path / "stderr.txt").read_text()[-3000:]
                assert time.monotonic() - t0 < 1200, "SGLang did not serve in 20 min"
                time.sleep(1.0)
            _stop_pp1(ssh_cluster)
            out, _ = proc.communicate(timeout=600)
        finally:
            if proc.poll() is None:
                proc.kill()
    took = time.monotonic() - t0
    assert proc.returncode == 12, f"{took:.0f} s\n{(tmp_path / 'stderr.txt').read_text()[-3000:]}"
    verdict = json.loads(out)
    assert (verdict["outcome"], verdict["form"], verdict["culprit_rank"]) == ("hang", "C", 1)
    pp1 = next(r for r in verdict["ranks"] if r["rank"] == 1)
    assert (pp1["node"], pp1["host"], pp1["state"]) == ("node-1", "127.0.0.3", "stopped")
    launcher = json.loads((run_dir / "launcher.json").read_text())
    assert launcher["stacks"]["tool"] == "collector.py over ssh", launcher["stacks"]
    assert launcher["stack_links"]["0"][0]["link"] == "py-spy"  # PP0's, taken on its host
    assert (run_dir / "stacks" / "rank0.json").is_file()
    assert launcher["hang"]["stopped_ranks"] == [1]
    assert not _sglang_left(ssh_cluster), "a node's SGLang outlived the run"
    print(f"run --hosts hang C: {took:.0f} s")


def test_run_hosts_ctrl_c_leaves_nothing_on_either_host(ssh_cluster, tmp_path):
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("real SGLang not installed (python -m hicache_diag.engines.sglang.install)")
    config = _config_by_address(ssh_cluster)
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "hicache_diag.cli.main", "run", "--engine", "sglang"]
    cmd += ["--nnodes", "2", "--pp", "2", "--hosts", "127.0.0.2,127.0.0.3"]
    cmd += ["--ssh-config", str(config), "--requests", "400", "--out", str(run_dir), "--json"]
    env = {**os.environ, "HICACHE_DIAG_SGLANG_READY_TIMEOUT": "600"}
    t0 = time.monotonic()
    with open(tmp_path / "stderr.txt", "w") as err:
        # A test run from a background shell inherits SIGINT ignored: the CLI gets it back.
        reset = lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)  # noqa: E731
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env, preexec_fn=reset
        )
        try:
            while _busy_steps(run_dir / "rank1.jsonl") < 20:
                assert proc.poll() is None, (tmp_path / "stderr.txt").read_text()[-3000:]
                assert time.monotonic() - t0 < 1200, "SGLang did not serve in 20 min"
                time.sleep(1.0)
            proc.send_signal(signal.SIGINT)  # Ctrl-C
            out, _ = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 130, (tmp_path / "stderr.txt").read_text()[-3000:]
    assert json.loads(out)["outcome"] == "interrupted"
    assert not _sglang_left(ssh_cluster), "a node's SGLang outlived the Ctrl-C"
    launcher = json.loads((run_dir / "launcher.json").read_text())
    assert {n["schedulers_left"] for n in launcher["nodes"].values()} == {0}
