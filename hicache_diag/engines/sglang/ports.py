"""Where SGLang's servers listen: free TCP ports, picked on the machine that binds them, and the
address forms SGLang parses (0.5.23 srt/utils/network.py `NetworkAddress`).

A port is picked by binding port 0 and closing the socket: something may take it before SGLang
binds it (seconds later). SGLang's own launcher takes the same risk (server_args.py
`PortArgs.init_new`: `get_free_port_below_ephemeral` binds, closes, and a scheduler binds
later); a port taken meanwhile fails the start, which is the environment's."""

from __future__ import annotations

import inspect
import ipaddress

# SGLang derives more ports from --port (0.5.1x: a gRPC port at port + 10000, checked <= 65535
# at start-up), so the HTTP port stays below that headroom.
MAX_PORT = 65535 - 10000
# Where a host's start check binds: the wildcard, dual-stack first, so a port it hands back is
# free on every address of the host in both families (a specific bind on it would have failed
# ours), whatever address ssh's HostName names (a NAT or jump host's may not be the host's own).
ANY_ADDRESS = ("::", "0.0.0.0")


def free_ports(count, addresses=("127.0.0.1",), max_port=MAX_PORT):
    """`count` distinct free TCP ports on the first of `addresses` that binds, each at most
    `max_port`. Plain stdlib without annotations: its source runs on the hosts too (their
    release's Python, remote_nodes.py `SHARED_PROBE`)."""
    import socket

    held, ports = [], []
    try:
        for address in addresses:
            family = socket.AF_INET6 if ":" in address else socket.AF_INET
            try:
                for _ in range(64 * count):
                    s = socket.socket(family, socket.SOCK_STREAM)
                    held.append(s)  # held open until all are picked: no port twice
                    if family == socket.AF_INET6:
                        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
                    s.bind((address, 0))
                    port = s.getsockname()[1]
                    if port <= max_port:
                        ports.append(port)
                    if len(ports) == count:
                        return ports
            except OSError:  # no such family or address here: the next one
                pass
            ports = []
        raise OSError(f"no free TCP port on {', '.join(addresses)}")
    finally:
        for s in held:
            s.close()


def free_port() -> int:
    """One free port on this machine's loopback (a server launched here)."""
    return free_ports(1)[0]


def free_ports_source() -> str:
    """`free_ports` as Python source, for a host's own Python to run."""
    return inspect.getsource(free_ports)


def bracketed(host: str) -> str:
    """An IPv6 address in brackets (`[::1]`), as URLs and SGLang's `HOST:PORT` need it (its
    parser refuses a bare IPv6 address: ambiguous); an IPv4 address or a host name as is."""
    try:
        ipaddress.IPv6Address(host)
    except ValueError:
        return host
    return f"[{host}]"


def host_port(host: str, port: int) -> str:
    """`HOST:PORT` as SGLang's `--dist-init-addr` takes it (`[v6]:PORT` for IPv6)."""
    return f"{bracketed(host)}:{port}"


def http_url(host: str, port: int) -> str:
    return f"http://{host_port(host, port)}"
