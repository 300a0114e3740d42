"""`run --engine sglang --nnodes N`: one SGLang server per node, started with SGLang's own
multi-node flags (`--nnodes N --node-rank i --dist-init-addr HOST:PORT`), so that SGLang itself
places the PP stages on different nodes (entrypoints/engine.py `_calculate_rank_ranges`: pp 2 on
2 nodes puts PP0 on node 0 and PP1 on node 1).

Without hosts the nodes are local processes on loopback (docs/cluster.md): node 0's server
answers HTTP and owns the rendezvous; every node's launcher appends to the one server.log
(SGLang's `[PP1 TP0]` prefixes are launch-wide, so the per-rank logs split as for one node).
Node 0's server starts, watches and reaps the others, so the trial loop sees one server whose
schedulers each name their node (`node-1 PP1 TP0`, the label grammar `triage --live` uses).
With `--hosts` (a `NodePlacement`, built above this layer by engines/sglang/remote_nodes.py) node i
runs on hosts[i]: the placement's server launches and watches them there."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from hicache_diag.engines.sglang.install import SglangInstall
from hicache_diag.engines.sglang.launch_spec import LaunchSpec
from hicache_diag.engines.sglang.ports import free_port, host_port
from hicache_diag.engines.sglang.server import SchedulerProc, ServerStartError, SglangServer

LOCAL_HOST = "127.0.0.1"
OMP_BIND = "SGLANG_CPU_OMP_THREADS_BIND"


@dataclass(frozen=True, slots=True)
class NodePorts:
    """The TCP ports SGLang (0.5.23) binds on one node's host, free there. `http` is its
    `--port`: node 0's HTTP server, and on node i > 0 the health-check server
    (engine.py `launch_dummy_health_check_server`). `dist_init` is used on node 0 only: the
    `--dist-init-addr` port, where rank 0's torch.distributed TCPStore listens. Not ours:
    `nccl_port` (SGLang picks it on the host, and dials it only without --dist-init-addr) and
    the tokenizer/scheduler/detokenizer/rpc/metrics endpoints (ipc:// files without DP
    attention; with it, TCP ports derived from the --dist-init-addr port)."""

    http: int
    dist_init: int


class NodePlacement(Protocol):
    """Where the nodes run when not on loopback: `hosts[i]` (as the user named it) runs node i,
    `addresses[i]` is what the others and this machine dial, `ports[i]` are free on hosts[i]
    (asked of the host), `via` the launcher (ssh)."""

    via: str
    hosts: tuple[str, ...]
    addresses: tuple[str, ...]
    ports: tuple[NodePorts, ...]

    def server(self, install: SglangInstall, specs: list[LaunchSpec], run_dir: Path) -> Any:
        """An SglangServer holding every node's launch on its host."""
        ...


def node_name(node_rank: int) -> str:
    """The node's label, numbered as SGLang's --node-rank."""
    return f"node-{node_rank}"


def node_specs(spec: LaunchSpec, dist_init_addr: str) -> list[LaunchSpec]:
    """Each node's launch: the same server, its own --node-rank, one rendezvous."""
    return [
        replace(spec, node_rank=rank, dist_init_addr=dist_init_addr) for rank in range(spec.nnodes)
    ]


def host_specs(spec: LaunchSpec, addresses: tuple[str, ...], port: int) -> list[LaunchSpec]:
    """Each node's launch on its host: the rendezvous on node 0's address, and each server
    listening on its own host's address (node 0's is where this machine sends the workload).
    `port` is free on node 0's host; an IPv6 address is bracketed as SGLang's parser needs."""
    specs = node_specs(spec, host_port(addresses[0], port))
    return [replace(s, host=addresses[s.node_rank]) for s in specs]


def omp_bind(install: SglangInstall, spec: LaunchSpec) -> str:
    """SGLANG_CPU_OMP_THREADS_BIND for a node's schedulers: each node counts its cores from 0
    (gpu_id is node-local), so a node starts one core further on: loopback nodes (and the test
    rig's namespace "hosts", one machine) do not share a core."""
    cores = max(1, os.cpu_count() or 1)
    entries = install.launch.omp_bind_entries(spec.pp_size, spec.tp_size)
    first = spec.node_rank * len(node_ranks(spec))
    return "|".join(str((first + r) % cores) for r in range(entries))


def node_ranks(spec: LaunchSpec) -> list[tuple[int, int]]:
    """(pp, tp) of the schedulers SGLang starts on `spec`'s node, as its
    `_calculate_rank_ranges` computes them."""
    per_node = max(spec.pp_size // spec.nnodes, 1)
    nodes_per_stage = max(spec.nnodes // spec.pp_size, 1)
    stage = spec.node_rank // nodes_per_stage
    tp_per_node = spec.tp_size // nodes_per_stage
    tp0 = tp_per_node * (spec.node_rank % nodes_per_stage)
    pps = range(per_node * stage, per_node * (stage + 1))
    return [(pp, tp) for pp in pps for tp in range(tp0, tp0 + tp_per_node)]


class NodeServer(SglangServer):
    """One node's `launch_server`. Node 0's (the one the trial loop holds) starts, watches,
    discovers and reaps its `peers` too."""

    relaunch_on_taken_port = False  # the nodes' ports are agreed among them (dist-init-addr)

    def __init__(
        self, install: SglangInstall, spec: LaunchSpec, run_dir: Path, peers: tuple = ()
    ) -> None:
        super().__init__(install, spec, run_dir)
        self.node = node_name(spec.node_rank)
        self.peers: list[NodeServer] = list(peers)

    def ranks_here(self) -> int:
        return len(node_ranks(self.spec))

    def env(self, plugin_path: Path) -> dict[str, str]:
        env = super().env(plugin_path)
        if self.spec.cpu and OMP_BIND not in os.environ:
            env[OMP_BIND] = omp_bind(self.install, self.spec)
        return env

    def start(self, plugin_path: Path) -> None:
        super().start(plugin_path)
        for peer in self.peers:
            peer.start(plugin_path)

    def check_running(self) -> None:
        for server in (self, *self.peers):
            try:
                SglangServer.check_running(server)
            except ServerStartError as exc:
                raise ServerStartError(f"{server.node}: {exc}") from None

    def discover(self) -> list[SchedulerProc]:
        found = []
        for server in (self, *self.peers):
            for scheduler in SglangServer.discover(server):
                scheduler.node = server.node
                found.append(scheduler)
        self.schedulers = sorted(found, key=lambda s: s.rank)
        return self.schedulers

    def alive(self) -> bool:
        return super().alive() and all(SglangServer.alive(p) for p in self.peers)

    def close(self, grace_s: float = 0.0) -> float:
        took = super().close(grace_s)
        for peer in self.peers:
            took += peer.close(grace_s)
            self.removed_locks += peer.removed_locks
        return took

    def launch_lines(self) -> list[dict[str, Any]]:
        """The manifest's `sglang.nodes`: each node's argv and the ranks SGLang puts there."""
        return [
            {
                "node": server.node,
                "node_rank": server.spec.node_rank,
                "ranks": [f"PP{pp} TP{tp}" for pp, tp in node_ranks(server.spec)],
                "argv": server.spec.argv(self.install.python, server.port),
            }
            for server in (self, *self.peers)
        ]


def make_server(
    install: SglangInstall,
    spec: LaunchSpec,
    run_dir: Path,
    log: Path | None = None,
    placement: NodePlacement | None = None,
) -> SglangServer:
    """One server (its log at `log`: a warm pool's), or with --nnodes > 1 node 0's holding the
    others (never warm: run_options refuses --warm-server with --nnodes), or with a placement
    every node on its host."""
    if spec.nnodes <= 1:
        return SglangServer(install, spec, run_dir, log)
    if placement is not None:
        specs = host_specs(spec, placement.addresses, placement.ports[0].dist_init)
        return placement.server(install, specs, run_dir)
    specs = node_specs(spec, spec.dist_init_addr or host_port(LOCAL_HOST, free_port()))
    peers = tuple(NodeServer(install, s, run_dir) for s in specs[1:])
    return NodeServer(install, specs[0], run_dir, peers)


def placement_evidence(server: SglangServer, placement: NodePlacement | None = None) -> list[str]:
    """One verdict line saying where each rank ran (nothing for a single-node run)."""
    if server is None or server.spec.nnodes <= 1:
        return []
    lines = server.launch_lines()
    where = f"{placement.via}: {','.join(placement.hosts)}" if placement else "loopback"
    nodes = "; ".join(
        f"{n['node']}{' on ' + n['host'] if n.get('host') else ''}: {', '.join(n['ranks'])}"
        for n in lines
    )
    return [f"SGLang across {server.spec.nnodes} nodes (--nnodes, {where}): {nodes}"]
