"""`run --engine sglang --nnodes N --hosts A,B`: the hosts checked before anything starts, and
the placement (sglang/nodes.py `NodePlacement`) whose server runs node i on hosts[i]
(node_server.py).

The run dir must be on a path every host sees at the same path (a shared filesystem): SGLang's
schedulers on each host write their recorder files there as they run, and the hang watch reads
them while the run goes on, so copying back at the end would be too late. The release's Python,
the plugin bundle and the model are needed at the same paths too. Checked here, each host in
parallel: `ssh HOST true` answers; then the release's Python reads a token file written here,
next to the run dir, and says which of those paths it lacks. Each failure is one line, exit 2,
nothing started. That same call returns ports free on the host (sglang/ports.py), so the ports
each node binds are the host's own, not a guess made here. The addresses the nodes dial (the
rendezvous, node 0's HTTP port) are each host's `HostName` as ssh resolves it (`ssh -G`)."""

from __future__ import annotations

import secrets
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hicache_diag.cluster.base import Node
from hicache_diag.cluster.ssh import SshExecutor, hostname, parse_hosts, probe
from hicache_diag.engines.sglang.install import SglangInstall
from hicache_diag.engines.sglang.launch_spec import LaunchSpec
from hicache_diag.engines.sglang.nodes import NodePorts, node_name
from hicache_diag.engines.sglang.ports import ANY_ADDRESS, MAX_PORT, free_ports_source
from hicache_diag.errors import UsageError

# Ports asked of each host: its node's --port, and the --dist-init-addr port (node 0's only:
# one command for every host).
PORTS_PER_HOST = 2
# On the host: print the token file; the free ports (or why none); each given path it lacks.
_PROBE_MAIN = (
    "import os,sys\n"
    "a=sys.argv[1]\n"
    "print(open(a).read() if os.path.isfile(a) else '')\n"
    "try:\n"
    f"    print(*free_ports({PORTS_PER_HOST}, {ANY_ADDRESS!r}, {MAX_PORT}))\n"
    "except OSError as e:\n"
    "    print(e)\n"
    "print('\\n'.join(p for p in sys.argv[2:] if not os.path.exists(p)))\n"
)
SHARED_PROBE = f"MAX_PORT = {MAX_PORT}\n{free_ports_source()}{_PROBE_MAIN}"


@dataclass(frozen=True, slots=True)
class SshPlacement:
    """sglang/nodes.py `NodePlacement` through ssh: node i on hosts[i]."""

    hosts: tuple[str, ...]
    addresses: tuple[str, ...]
    ports: tuple[NodePorts, ...]  # free on hosts[i], as the host answered
    ssh_config: str | None = None
    via: str = "ssh"

    def executor(self) -> SshExecutor:
        return _executor(self.hosts, self.ssh_config)

    def server(self, install: SglangInstall, specs: list[LaunchSpec], run_dir: Path) -> Any:
        from hicache_diag.engines.sglang.node_server import SshNodes

        ports = [p.http for p in self.ports]
        return SshNodes(install, specs, run_dir, self.executor(), ports)


def _executor(hosts: tuple[str, ...], ssh_config: str | None) -> SshExecutor:
    nodes = [Node(node_name(i), h) for i, h in enumerate(hosts)]
    return SshExecutor(nodes=nodes, config=ssh_config)


def place(cfg: Any) -> Any:
    """The sglang run config with its nodes placed on `cfg.hosts` (unchanged without hosts)."""
    if not cfg.hosts:
        return cfg
    if shutil.which("ssh") is None:
        raise UsageError("--hosts: no ssh client here (install openssh-client)")
    hosts = tuple(n.address for n in parse_hosts(",".join(cfg.hosts)))
    executor = _executor(hosts, cfg.ssh_config)
    _check(probe(executor, ["true"]))
    ports = _check_shared(executor, cfg)
    addresses = tuple(hostname(executor, n) for n in executor.nodes)
    return replace(cfg, placement=SshPlacement(hosts, addresses, ports, cfg.ssh_config))


def _check(results: list[tuple[Node, str | None, str]]) -> None:
    errors = [why for _, why, _ in results if why]
    if errors:
        raise UsageError(f"--hosts: {errors[0]}")


def shared_paths(cfg: Any) -> list[str]:
    """What every host must see at the same path: the release's Python, the plugin bundle, the
    model (the run dir's folder is the token's)."""
    from hicache_diag.engines.sglang.bundle import plugin_bundle

    return [cfg.python, str(plugin_bundle().root), str(cfg.spec.model)]


def run_parent(out: str | None) -> Path:
    """The folder the run dir will be made in (trials/rundir.py prepare_run_dir), or its
    nearest existing ancestor (the run makes the rest): the hosts must see it."""
    parent = (Path(out) if out else Path("runs") / "x").resolve().parent
    while not parent.is_dir() and parent != parent.parent:
        parent = parent.parent
    return parent


def _check_shared(executor: SshExecutor, cfg: Any) -> tuple[NodePorts, ...]:
    """Every host sees the run dir's folder and the shared paths; the ports free on each."""
    parent = run_parent(cfg.out)
    token_text = secrets.token_hex(16)
    token = parent / f".hicache-diag-shared-{token_text[:8]}"
    token.write_text(token_text)
    paths = shared_paths(cfg)
    try:
        results = probe(executor, [cfg.python, "-c", SHARED_PROBE, str(token), *paths])
    finally:
        token.unlink(missing_ok=True)
    ports = []
    for node, why, out in results:
        if why is not None:
            if "no python3" in why:  # exit 127: the shell found no such interpreter
                why = f"no {cfg.python} there (the release's Python must be at the same path)"
            raise UsageError(f"--hosts: {why}")
        ports.append(read_probe(node.address, out, token_text, parent))
    return tuple(ports)


def read_probe(host: str, out: str, token_text: str, parent: Path) -> NodePorts:
    """A host's answer to SHARED_PROBE: the token, the free ports, the paths it lacks."""
    lines = out.splitlines()
    if lines[:1] != [token_text]:
        raise UsageError(
            f"--hosts: {host} does not see {str(parent)!r} (the run dir must be on a path "
            "every host shares, at the same path; give --out on a shared filesystem)"
        )
    missing = ", ".join(p for p in lines[2:] if p)
    if missing:
        raise UsageError(f"--hosts: {host} lacks {missing} (needed at the same path there)")
    words = lines[1].split() if len(lines) > 1 else []
    if len(words) != PORTS_PER_HOST or not all(w.isdigit() for w in words):
        said = " ".join(words) or "nothing"
        raise UsageError(f"--hosts: {host} gave no free TCP ports ({said})")
    return NodePorts(http=int(words[0]), dist_init=int(words[1]))
