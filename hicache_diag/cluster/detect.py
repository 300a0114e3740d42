"""Which executor: `--via` when given, else the one the flags (or a Slurm job's environment)
name unambiguously, else this machine."""

from __future__ import annotations

import os
from dataclasses import dataclass

from hicache_diag.cluster.base import Executor
from hicache_diag.cluster.kubectl import KubectlExecutor
from hicache_diag.cluster.local import LocalExecutor
from hicache_diag.cluster.slurm import SlurmExecutor
from hicache_diag.cluster.ssh import SshExecutor, parse_hosts
from hicache_diag.errors import UsageError

VIAS = ("local", "ssh", "slurm", "kubectl")


@dataclass(frozen=True, slots=True)
class ClusterFlags:
    """The cluster flags as given."""

    via: str | None = None
    hosts: str | None = None
    jobid: str | None = None
    selector: str | None = None
    namespace: str | None = None
    container: str | None = None
    ssh_config: str | None = None


def detect(t: ClusterFlags, env: dict[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    if t.via is not None:
        if t.via not in VIAS:
            raise UsageError(f"--via {t.via!r}: choose one of {', '.join(VIAS)}")
        return t.via
    flags = (("ssh", t.hosts), ("slurm", t.jobid), ("kubectl", t.selector))
    named = [via for via, flag in flags if flag]
    if len(named) > 1:
        raise UsageError(f"--hosts/--jobid/--selector name {' and '.join(named)}: give --via")
    if named:
        return named[0]
    return "slurm" if env.get("SLURM_JOB_ID") else "local"


def executor_for(t: ClusterFlags, env: dict[str, str] | None = None) -> Executor:
    env = os.environ if env is None else env
    via = detect(t, env)
    nodes = parse_hosts(t.hosts) if t.hosts else []
    if via != "kubectl" and (t.selector or t.namespace or t.container):
        raise UsageError(f"--selector/--namespace/--container are for --via kubectl, not {via}")
    if via == "ssh":
        return SshExecutor(nodes=nodes, config=t.ssh_config)
    if t.ssh_config:
        raise UsageError(f"--ssh-config is for --via ssh, not {via}")
    if via == "slurm":
        return SlurmExecutor(nodes=nodes, jobid=t.jobid or env.get("SLURM_JOB_ID", ""))
    if via == "kubectl":
        return KubectlExecutor(
            nodes=nodes, selector=t.selector, namespace=t.namespace, container=t.container
        )
    if nodes or t.jobid:
        raise UsageError("--hosts/--jobid need --via ssh, slurm or kubectl")
    return LocalExecutor()
