"""`run --hosts`'s eyes on a node, without SGLang (seconds): the scheduler stand-ins of
fake_rank.py on two real sshd nodes (each its own PID namespace), seen by the nodes' server
(engines/sglang/node_server.py) only through the collector over ssh. The pids it records are the
namespaces' own (not this machine's), a SIGSTOPped PP1 on node-2 reads `stopped`, a stack is
taken through the collector, and a node whose sshd session is cut is lost, its rank not
judged."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from hicache_diag.cluster.base import Node
from hicache_diag.cluster.ssh import SshExecutor
from hicache_diag.engines.sglang.install import SglangInstall
from hicache_diag.engines.sglang.launch_spec import LaunchSpec
from hicache_diag.engines.sglang.node_server import SEEN_BY, SshNodes
from hicache_diag.engines.sglang.nodes import host_specs
from hicache_diag.engines.sglang.ports import MAX_PORT
from hicache_diag.engines.sglang.remote_nodes import place
from hicache_diag.errors import UsageError
from tests.cluster.sshd import scheduler_pid

pytestmark = [pytest.mark.multinode, pytest.mark.process]


def _server(cluster, tmp_path) -> SshNodes:
    executor = SshExecutor(
        nodes=[Node("node-0", "node-1"), Node("node-1", "node-2")],
        config=str(cluster.client_config),
    )
    install = SglangInstall(python="python3", version="0.5.23", package_dir=tmp_path)
    specs = host_specs(LaunchSpec(model=tmp_path, pp_size=2, nnodes=2), ("a", "b"), 1)
    server = SshNodes(install, specs, tmp_path, executor, [1, 2])
    for w in server.watches:  # the watch alone: the launches are fake_rank.py's, started above
        w.start()
    server.launchers = [_Running(), _Running()]  # fake_rank.py's launches, not ours to watch
    return server


class _Running:
    returncode = None

    def poll(self):
        return None


def test_node_facts_and_stacks_come_through_the_collector(pp2_job, tmp_path):
    cluster, procs = pp2_job
    server = _server(cluster, tmp_path)
    host_pids = [scheduler_pid(p) for p in procs]
    try:
        ranks = server.discover()
        assert [(s.rank, s.node, s.host, s.seen_by) for s in ranks] == [
            (0, "node-0", "node-1", SEEN_BY),
            (1, "node-1", "node-2", SEEN_BY),
        ]
        assert not {s.pid for s in ranks} & set(host_pids)  # each namespace's own pid
        for s in ranks:  # which, here, is no scheduler at all (or no process)
            try:
                assert not psutil.Process(s.pid).cmdline()[0].startswith("sglang::")
            except (psutil.NoSuchProcess, IndexError):
                pass
        os.kill(host_pids[1], signal.SIGSTOP)
        time.sleep(1.5)
        assert server.kernel_states(ranks)[1] == "stopped"
        assert server.poll() == [] and ranks[1].state == "stopped"
        (tmp_path / "stacks").mkdir()  # the run dir's (trials/rundir.py)
        record = server.dump_stacks(tmp_path, [ranks[0]])
        assert record.tool == SEEN_BY and record.error is None
        threads = json.loads((tmp_path / "stacks" / "rank0.json").read_text())
        frames = [f["name"] for t in threads for f in t["frames"]]
        assert "recv_object" in frames  # PP0 waits for the stopped PP1
        assert server.stack_links["0"][0]["link"] == "py-spy"
        cluster.node("node-2").stop_sshd()
        for child in psutil.Process(cluster.node("node-2").init_pid()).children(recursive=True):
            try:
                if "sshd" in child.name():  # the watch's session: its link is cut
                    child.kill()
            except psutil.NoSuchProcess:
                pass  # ended with the listener
        end = time.monotonic() + 15
        while time.monotonic() < end and server.watches[1].lost is None:
            time.sleep(0.2)
        assert server.watches[1].lost and server.watches[0].lost is None
        assert not server.alive() and list(server.lost) == ["node-1"]
        assert server.poll() == [] and ranks[1].state == "stopped"  # never judged after
    finally:
        try:
            os.kill(host_pids[1], signal.SIGCONT)
        except ProcessLookupError:
            pass
        for w in server.watches:
            w.close()


@dataclass(frozen=True)
class _Cfg:
    """What `place` reads of the sglang run config."""

    hosts: tuple[str, ...]
    ssh_config: str
    python: str
    out: str
    spec: SimpleNamespace
    placement: object = None


def _cfg(cluster, out: Path, python: str = sys.executable) -> _Cfg:
    model = SimpleNamespace(model=out.parent)
    return _Cfg(("node-1", "node-2"), str(cluster.client_config), python, str(out), model)


def test_place_checks_the_hosts_and_resolves_their_addresses(ssh_cluster, tmp_path):
    cfg = place(_cfg(ssh_cluster, tmp_path / "run"))
    assert cfg.placement.hosts == ("node-1", "node-2")
    assert cfg.placement.addresses == ("127.0.0.2", "127.0.0.3")  # ssh -G: their HostName
    for ports in cfg.placement.ports:  # asked of each host in the same check
        assert ports.http != ports.dist_init and max(ports.http, ports.dist_init) <= MAX_PORT
        for port in (ports.http, ports.dist_init):
            with socket.socket() as s:  # the nodes share this machine's network
                s.bind(("127.0.0.1", port))
    assert not list(tmp_path.glob(".hicache-diag-shared-*"))  # the token is removed
    with pytest.raises(UsageError, match="no /nonexistent/python3 there"):
        place(_cfg(ssh_cluster, tmp_path / "run", "/nonexistent/python3"))
    private = tmp_path / "private"  # mounted after the nodes' namespaces were made: theirs
    private.mkdir()  # stays the empty folder (private mount propagation)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(private)], check=True)
    try:
        with pytest.raises(UsageError, match="node-1 does not see .*private"):
            place(_cfg(ssh_cluster, private / "run"))
    finally:
        subprocess.run(["umount", str(private)], check=True)
