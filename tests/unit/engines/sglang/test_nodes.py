"""`run --engine sglang --nnodes N`'s launch specs per node (engines/sglang/nodes.py): each
node's argv carries SGLang's own multi-node flags with one rendezvous, the ranks SGLang puts on
each node are the ones its `_calculate_rank_ranges` computes, and node 0's server holds the
others with their own ports and cores."""

from __future__ import annotations

from pathlib import Path

import pytest

from hicache_diag.engines.sglang.install import SglangInstall
from hicache_diag.engines.sglang.launch_spec import LaunchSpec
from hicache_diag.engines.sglang.nodes import NodeServer, make_server, node_ranks, node_specs
from hicache_diag.engines.sglang.server import SglangServer


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_each_node_gets_its_rank_and_the_one_rendezvous(tmp_path: Path) -> None:
    spec = LaunchSpec(model=tmp_path, pp_size=2, nnodes=2)
    specs = node_specs(spec, "127.0.0.1:29500")
    argvs = [s.argv("python3", 30000 + i) for i, s in enumerate(specs)]
    assert [_flag(a, "--node-rank") for a in argvs] == ["0", "1"]
    for argv in argvs:
        assert _flag(argv, "--nnodes") == "2"
        assert _flag(argv, "--dist-init-addr") == "127.0.0.1:29500"
        assert _flag(argv, "--pp-size") == "2" and _flag(argv, "--model-path") == str(tmp_path)
    assert [_flag(a, "--port") for a in argvs] == ["30000", "30001"]
    assert [node_ranks(s) for s in specs] == [[(0, 0)], [(1, 0)]]


def test_a_single_node_launch_has_no_multi_node_flags(tmp_path: Path) -> None:
    argv = LaunchSpec(model=tmp_path, pp_size=2).argv("python3", 30000)
    assert not {"--nnodes", "--node-rank", "--dist-init-addr"} & set(argv)


@pytest.mark.parametrize(
    ("pp", "tp", "nnodes", "want"),
    [
        (4, 1, 2, [[(0, 0), (1, 0)], [(2, 0), (3, 0)]]),  # two stages a node
        (2, 2, 4, [[(0, 0)], [(0, 1)], [(1, 0)], [(1, 1)]]),  # a stage's TP ranks split
        (2, 2, 2, [[(0, 0), (0, 1)], [(1, 0), (1, 1)]]),
    ],
)
def test_ranks_per_node_follow_sglang(tmp_path: Path, pp, tp, nnodes, want) -> None:
    spec = LaunchSpec(model=tmp_path, pp_size=pp, tp_size=tp, nnodes=nnodes)
    assert [node_ranks(s) for s in node_specs(spec, "h:1")] == want


def test_node_zero_holds_the_others_with_own_ports_and_cores(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("SGLANG_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 4)
    install = SglangInstall(python="python3", version="0.5.23", package_dir=tmp_path)
    server = make_server(install, LaunchSpec(model=tmp_path, pp_size=2, nnodes=2), tmp_path)
    assert isinstance(server, NodeServer) and [p.node for p in server.peers] == ["node-1"]
    peer = server.peers[0]
    assert (server.node, server.spec.node_rank, peer.spec.node_rank) == ("node-0", 0, 1)
    assert server.port != peer.port
    assert server.spec.dist_init_addr == peer.spec.dist_init_addr
    assert server.log_path == peer.log_path  # one server.log: SGLang's prefixes are launch-wide
    plugin = tmp_path / "plugin.json"
    binds = [s.env(plugin)["SGLANG_CPU_OMP_THREADS_BIND"] for s in (server, peer)]
    assert [b.split("|")[0] for b in binds] == ["0", "1"]  # node 1's ranks start a core on
    lines = [(n["node"], n["ranks"]) for n in server.launch_lines()]
    assert lines == [("node-0", ["PP0 TP0"]), ("node-1", ["PP1 TP0"])]
    single = make_server(install, LaunchSpec(model=tmp_path, pp_size=2), tmp_path)
    assert type(single) is SglangServer


def test_each_rank_gets_its_share_of_cores_not_one_thread_per_core(tmp_path, monkeypatch) -> None:
    """Without sgl_kernel's binding every rank's torch would open a thread per core; the
    launcher gives each rank cores // ranks-on-this-machine, and a user's own setting wins."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    install = SglangInstall(python="python3", version="0.5.23", package_dir=tmp_path)
    plugin = tmp_path / "plugin.json"
    single = make_server(install, LaunchSpec(model=tmp_path, pp_size=2, tp_size=2), tmp_path)
    assert single.env(plugin)["OMP_NUM_THREADS"] == "2"  # 4 ranks on 8 cores
    nodes = make_server(install, LaunchSpec(model=tmp_path, pp_size=2, nnodes=2), tmp_path)
    assert nodes.env(plugin)["OMP_NUM_THREADS"] == "8"  # one rank on this node
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    tight = make_server(install, LaunchSpec(model=tmp_path, pp_size=4), tmp_path)
    assert tight.env(plugin)["OMP_NUM_THREADS"] == "1"  # never 0
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert tight.env(plugin)["OMP_NUM_THREADS"] == "3"
