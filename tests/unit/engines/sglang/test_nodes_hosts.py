"""`run --engine sglang --nnodes N --hosts A,B` without a cluster: each node's ssh command
(SGLang's own multi-node flags, the lifeline wrapper, the environment it needs), the facts of a
node's schedulers read from its collector's lines (never this machine's /proc), a node whose
link ends, and the verdict lines that name the hosts. The loopback launch is unchanged."""

from __future__ import annotations

import shlex
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from hicache_diag.cluster.base import LIFELINE, Node
from hicache_diag.cluster.ssh import SshExecutor
from hicache_diag.engines.sglang.install import SglangInstall
from hicache_diag.engines.sglang.launch_spec import LaunchSpec
from hicache_diag.engines.sglang.node_server import SshNodes
from hicache_diag.engines.sglang.nodes import NodePorts, host_specs, make_server, placement_evidence
from hicache_diag.engines.sglang.remote_nodes import SshPlacement, place, run_parent
from hicache_diag.engines.sglang.server import SchedulerProc
from hicache_diag.engines.sglang.trial import _lost_node
from hicache_diag.errors import UsageError
from hicache_diag.evidence.verdict import CrashForm, Outcome, RankState, Verdict

HOSTS = ("gpu-a", "gpu-b")
ADDRS = ("10.0.0.1", "10.0.0.2")
PORTS = (NodePorts(30001, 29501), NodePorts(30002, 29502))  # as the hosts answered


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def _nodes(tmp_path: Path, monkeypatch) -> SshNodes:
    monkeypatch.delenv("SGLANG_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 4)
    install = SglangInstall(python="/opt/py/bin/python3", version="0.5.23", package_dir=tmp_path)
    config = tmp_path / "my_ssh_config"  # the executor checks it is a regular file
    config.write_text("Host *\n")
    placement = SshPlacement(HOSTS, ADDRS, PORTS, str(config))
    spec = LaunchSpec(model=tmp_path, pp_size=2, nnodes=2)
    server = make_server(install, spec, tmp_path, placement=placement)
    assert isinstance(server, SshNodes) and server.remote
    return server


def test_each_host_gets_sglangs_flags_and_one_rendezvous_on_node_0(tmp_path) -> None:
    specs = host_specs(LaunchSpec(model=tmp_path, pp_size=2, nnodes=2), ADDRS, 29500)
    argvs = [s.argv("python3", 30000) for s in specs]
    assert [_flag(a, "--node-rank") for a in argvs] == ["0", "1"]
    assert {_flag(a, "--dist-init-addr") for a in argvs} == {"10.0.0.1:29500"}
    assert [_flag(a, "--host") for a in argvs] == list(ADDRS)  # node 0's: where we send work


def test_a_node_runs_through_ssh_under_the_lifeline(tmp_path, monkeypatch) -> None:
    server = _nodes(tmp_path, monkeypatch)
    plugin = tmp_path / "plugin.json"
    for i in (0, 1):
        argv = server.launch_argv(i, plugin)
        assert argv[:3] == ["ssh", "-F", str(tmp_path / "my_ssh_config")]
        assert "BatchMode=yes" in argv
        assert argv[-2] == HOSTS[i]
        remote = shlex.split(argv[-1])
        assert remote[:5] == ["/opt/py/bin/python3", "-c", LIFELINE, str(tmp_path), "env"]
        env = dict(a.split("=", 1) for a in remote[5 : remote.index("/opt/py/bin/python3", 5)])
        assert env["HICACHE_DIAG_PLUGIN_CONFIG"] == str(plugin)
        assert "PYTHONPATH" in env and env["SGLANG_USE_CPU_ENGINE"] == "1"
        assert env["SGLANG_CPU_OMP_THREADS_BIND"].split("|")[0] == str(i)  # a core on per node
        sglang = remote[remote.index("/opt/py/bin/python3", 5) :]
        assert sglang[1:3] == ["-m", "sglang.launch_server"]
        assert _flag(sglang, "--node-rank") == str(i) and _flag(sglang, "--host") == ADDRS[i]
        assert _flag(sglang, "--dist-init-addr") == "10.0.0.1:29501"  # node 0's host's port
        assert _flag(sglang, "--port") == str(PORTS[i].http)  # free on its own host
    assert server.url == "http://10.0.0.1:30001"


def test_the_manifest_and_evidence_name_each_host(tmp_path, monkeypatch) -> None:
    server = _nodes(tmp_path, monkeypatch)
    lines = server.launch_lines()
    assert [(n["node"], n["host"], n["via"], n["ranks"]) for n in lines] == [
        ("node-0", "gpu-a", "ssh", ["PP0 TP0"]),
        ("node-1", "gpu-b", "ssh", ["PP1 TP0"]),
    ]
    (line,) = placement_evidence(server, SshPlacement(HOSTS, ADDRS, PORTS))
    assert line == (
        "SGLang across 2 nodes (--nnodes, ssh: gpu-a,gpu-b): node-0 on gpu-a: PP0 TP0; "
        "node-1 on gpu-b: PP1 TP0"
    )


def test_loopback_nodes_are_unchanged(tmp_path) -> None:
    install = SglangInstall(python="python3", version="0.5.23", package_dir=tmp_path)
    server = make_server(install, LaunchSpec(model=tmp_path, pp_size=2, nnodes=2), tmp_path)
    assert not server.remote
    assert _flag(server.launch_lines()[1]["argv"], "--dist-init-addr").startswith("127.0.0.1:")
    assert "host" not in server.launch_lines()[1]
    (line,) = placement_evidence(server)
    assert line == "SGLang across 2 nodes (--nnodes, loopback): node-0: PP0 TP0; node-1: PP1 TP0"


class _Proc:
    def __init__(self, rc=None):
        self.returncode = rc

    def poll(self):
        return self.returncode


def _watching(server: SshNodes, procs: list[dict], t: float) -> None:
    """node-1's collector line: `procs` as it saw them at `t` (pids of its own table)."""
    watch = server.watches[1]
    watch.doc = {"node": "node-1", "t": t, "processes": procs}
    watch.proc = _Proc()


def _sched(rank: int, pid: int, node: str) -> SchedulerProc:
    return SchedulerProc(pid, rank, 0, f"sglang::scheduler_PP{rank}_TP0", rank, node=node)


def test_node_facts_come_from_its_collector(tmp_path, monkeypatch) -> None:
    server = _nodes(tmp_path, monkeypatch)
    server.schedulers = [_sched(1, 7, "node-1")]  # pid 7 of node-1's namespace, not ours
    title = "sglang::scheduler_PP1_TP0"
    _watching(server, [{"pid": 7, "title": title, "proc": {"state": "T (stopped)"}}], 1.0)
    assert server.kernel_states(server.schedulers) == {1: "stopped"}
    assert server.poll() == [] and server.schedulers[0].state == "stopped"
    zombie = {"state": "Z (zombie)", "wait_status": 1 << 8}
    _watching(server, [{"pid": 7, "title": title, "proc": zombie}], 2.0)
    (ended,) = server.poll()
    assert (ended.state, ended.exitcode, ended.signal) == ("crashed", 1, None)
    server.schedulers = [_sched(1, 7, "node-1")]
    _watching(server, [], 3.0)  # gone from its table: reaped before we read a status
    (ended,) = server.poll()
    assert (ended.state, ended.exitcode) == ("crashed", None)


def test_a_launcher_exit_waits_for_its_nodes_facts(tmp_path, monkeypatch) -> None:
    server = _nodes(tmp_path, monkeypatch)
    server.launchers = [_Proc(), _Proc(rc=1)]
    server.watches[0].proc = _Proc()
    _watching(server, [], time.time() - 10)
    assert server.alive()  # node-1's launcher ended; its facts after that not read yet
    _watching(server, [], time.time() + 1)
    assert not server.alive() and not server.lost


def test_a_dropped_link_loses_the_node_not_its_ranks(tmp_path, monkeypatch) -> None:
    server = _nodes(tmp_path, monkeypatch)
    server.launchers = [_Proc(), _Proc()]
    server.watches[0].proc = _Proc()
    _watching(server, [], time.time())
    server.watches[1].proc = _Proc(rc=255)
    server.watches[1]._stderr = b"Connection to 10.0.0.2 closed by remote host.\n"
    server.schedulers = [_sched(1, 7, "node-1")]
    assert not server.alive() and "node-1" in server.lost
    assert server.poll() == [] and server.schedulers[0].state == "running"  # never judged
    crash = Verdict(Outcome.CRASH, CrashForm.B, failed_rank=1, culprit_rank=1)
    crash.ranks = [RankState(1, 1, 0, 7, "crashed", node="node-1", host="gpu-b")]
    verdict = _lost_node(crash, server.lost)
    assert (verdict.outcome, verdict.form, verdict.culprit_rank) == (Outcome.UNDECIDED, None, None)
    assert "node-1" in verdict.evidence[0] and "never blamed" in verdict.evidence[0]


def test_ranks_name_their_host_in_verdict_json() -> None:
    v = Verdict(Outcome.OK, ranks=[RankState(1, 1, 0, 7, "exited", node="node-1", host="b")])
    assert v.to_json()["ranks"][0]["host"] == "b"
    assert "host" not in Verdict(Outcome.OK, ranks=[RankState(0, 0, 0)]).to_json()["ranks"][0]


def test_the_run_dirs_nearest_existing_folder_is_checked(tmp_path) -> None:
    assert run_parent(str(tmp_path / "a" / "b" / "run")) == tmp_path
    assert run_parent(str(tmp_path / "run")) == tmp_path


@pytest.mark.process
@pytest.mark.skipif(shutil.which("ssh") is None, reason="no ssh client")
def test_an_unknown_host_is_one_line_before_anything_starts(tmp_path) -> None:
    cfg = SimpleNamespace(hosts=("nosuch-27r-a.invalid", "nosuch-27r-b.invalid"), ssh_config=None)
    with pytest.raises(UsageError, match="ssh nosuch-27r-a.invalid: unknown host"):
        place(cfg)


def test_ssh_commands_come_from_the_one_executor(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cfg").write_text("Host *\n")
    ex = SshExecutor(nodes=[Node("node-1", "b")], config="cfg")
    server_argv = ex.argv(ex.nodes[0], ["true"])
    assert server_argv[:3] == ["ssh", "-F", "cfg"] and server_argv[-2:] == ["b", "true"]
