"""`run --hosts`'s ports and addresses without a cluster: the ports each node binds are the ones
its host answered in the start check (never picked on this machine), the check's answer is
read strictly, and an IPv6 host address is bracketed where SGLang 0.5.23 parses HOST:PORT
(`NetworkAddress.parse` refuses a bare one) and in URLs, bare in `--host`."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from hicache_diag.engines.sglang.install import SglangInstall
from hicache_diag.engines.sglang.launch_spec import LaunchSpec
from hicache_diag.engines.sglang.node_server import SshNodes
from hicache_diag.engines.sglang.nodes import NodePorts, host_specs, make_server
from hicache_diag.engines.sglang.ports import MAX_PORT, bracketed, free_ports, host_port, http_url
from hicache_diag.engines.sglang.remote_nodes import SHARED_PROBE, SshPlacement, read_probe
from hicache_diag.errors import UsageError

TOKEN = "0123abcd"
PARENT = Path("/shared/runs")


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def _server(tmp_path: Path, addresses: tuple[str, ...], ports: tuple[NodePorts, ...]) -> SshNodes:
    install = SglangInstall(python="/opt/py/bin/python3", version="0.5.23", package_dir=tmp_path)
    placement = SshPlacement(("gpu-a", "gpu-b"), addresses, ports)
    spec = LaunchSpec(model=tmp_path, pp_size=2, nnodes=2)
    server = make_server(install, spec, tmp_path, placement=placement)
    assert isinstance(server, SshNodes)
    return server


def test_each_node_binds_the_ports_its_own_host_gave(tmp_path) -> None:
    ports = (NodePorts(41001, 41002), NodePorts(42001, 42002))
    server = _server(tmp_path, ("10.0.0.1", "10.0.0.2"), ports)
    argvs = [n["argv"] for n in server.launch_lines()]
    assert [_flag(a, "--port") for a in argvs] == ["41001", "42001"]
    assert {_flag(a, "--dist-init-addr") for a in argvs} == {"10.0.0.1:41002"}  # hosts[0]'s
    assert server.url == "http://10.0.0.1:41001"


def test_ipv6_hosts_are_bracketed_where_sglang_parses_host_port(tmp_path) -> None:
    ports = (NodePorts(41001, 41002), NodePorts(42001, 42002))
    server = _server(tmp_path, ("fd00::1", "fd00::2"), ports)
    argvs = [n["argv"] for n in server.launch_lines()]
    assert {_flag(a, "--dist-init-addr") for a in argvs} == {"[fd00::1]:41002"}
    assert [_flag(a, "--host") for a in argvs] == ["fd00::1", "fd00::2"]  # a bind address
    assert server.url == "http://[fd00::1]:41001"


def test_address_forms() -> None:
    assert [bracketed(h) for h in ("::1", "gpu1", "10.0.0.1", "fe80::1%eth0")] == [
        "[::1]",
        "gpu1",
        "10.0.0.1",
        "[fe80::1%eth0]",
    ]
    assert host_port("gpu1.example.com", 5) == "gpu1.example.com:5"
    assert http_url("::1", 30000) == "http://[::1]:30000"
    specs = host_specs(LaunchSpec(model=Path("m"), pp_size=2, nnodes=2), ("::1", "::2"), 7)
    assert specs[1].dist_init_addr == "[::1]:7"


def test_the_hosts_answer_is_read_for_its_ports() -> None:
    assert read_probe("a", f"{TOKEN}\n41001 41002\n\n", TOKEN, PARENT) == NodePorts(41001, 41002)
    with pytest.raises(UsageError, match="a gave no free TCP ports \\(no free TCP port on ::"):
        read_probe("a", f"{TOKEN}\nno free TCP port on ::, 0.0.0.0\n\n", TOKEN, PARENT)
    with pytest.raises(UsageError, match="a gave no free TCP ports \\(nothing\\)"):
        read_probe("a", f"{TOKEN}\n", TOKEN, PARENT)
    with pytest.raises(UsageError, match="a does not see '/shared/runs'"):
        read_probe("a", "\n41001 41002\n\n", TOKEN, PARENT)
    with pytest.raises(UsageError, match="a lacks /opt/model \\(needed"):
        read_probe("a", f"{TOKEN}\n41001 41002\n/opt/model\n", TOKEN, PARENT)


@pytest.mark.process
def test_the_check_itself_returns_free_ports(tmp_path) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    argv = [sys.executable, "-S", "-c", SHARED_PROBE, str(token), str(tmp_path), "/nonexistent"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    with pytest.raises(UsageError, match="lacks /nonexistent"):
        read_probe("here", out, TOKEN, tmp_path)
    ports = read_probe("here", out.replace("/nonexistent", ""), TOKEN, tmp_path)
    assert ports.http != ports.dist_init and max(ports.http, ports.dist_init) <= MAX_PORT
    for port in (ports.http, ports.dist_init):
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free (one machine: the "host" is this one)


def test_free_ports_falls_back_to_the_next_address() -> None:
    ports = free_ports(3, ("192.0.2.1", "127.0.0.1"))  # TEST-NET: no address of ours
    assert len(set(ports)) == 3 and max(ports) <= MAX_PORT
    with pytest.raises(OSError, match="no free TCP port on 192.0.2.1"):
        free_ports(1, ("192.0.2.1",))
