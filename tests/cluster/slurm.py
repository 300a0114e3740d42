"""A real Slurm on this machine for multi-node tests: one slurmctld and one slurmd per node
name (sl-1, sl-2, ... on 127.0.0.1, each on its own port: Slurm's multiple-slurmd layout),
configured in a temporary folder (SLURM_CONF), auth/none so no munge daemon is needed.
Installs slurm-wlm with apt when missing; needs root."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from tests.cluster.sshd import ensure_package


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _conf(root: Path, names: list[str]) -> str:
    host = socket.gethostname()
    lines = [
        "ClusterName=hdiag",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={_port()}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/none",
        "CredType=cred/none",
        "MpiDefault=none",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "SchedulerType=sched/builtin",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "ReturnToService=2",
        "SlurmdParameters=config_overrides",
        f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool/%n",
        f"SlurmctldPidFile={root}/slurmctld.pid",
        f"SlurmdPidFile={root}/slurmd-%n.pid",
        f"SlurmctldLogFile={root}/slurmctld.log",
        f"SlurmdLogFile={root}/slurmd-%n.log",
        "InactiveLimit=0",
        "KillWait=2",
        "MinJobAge=2",
    ]
    for name in names:
        where = f"NodeHostname={host} NodeAddr=127.0.0.1 Port={_port()}"
        lines.append(f"NodeName={name} {where} CPUs=4")
    lines.append(f"PartitionName=debug Nodes={','.join(names)} Default=YES MaxTime=10 State=UP")
    return "\n".join(lines) + "\n"


@dataclass
class Slurm:
    root: Path
    names: list[str]
    env: dict[str, str]
    daemons: list[subprocess.Popen] = field(default_factory=list)

    def run(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
        kw = {"env": self.env, "capture_output": True, "text": True, "timeout": 30}
        return subprocess.run(cmd, check=check, **kw)

    def wait_idle(self, timeout: float = 30.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            out = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False).stdout.split()
            states = dict(zip(out[::2], out[1::2], strict=False))
            if all(states.get(n) == "idle" for n in self.names):
                return
            time.sleep(0.3)
        raise RuntimeError(f"slurm nodes never idle: {states}")

    def stop(self) -> None:
        self.run("scancel", "--full", "-u", "root", check=False)
        time.sleep(0.5)
        for proc in self.daemons:
            # unshare ignores SIGTERM: kill the namespace's init (slurmd), which ends it all;
            # slurmctld's state is this test's scratch, so no graceful shutdown is owed.
            for child in psutil.Process(proc.pid).children():
                child.kill()
            proc.kill()
        for proc in self.daemons:
            proc.wait(10)


def start_slurm(root: Path, names: list[str]) -> Slurm:
    if os.geteuid() != 0:
        pytest.skip("slurmctld/slurmd need root here")
    ensure_package("/usr/sbin/slurmctld", "slurm-wlm")
    for sub in ("state", *(f"spool/{n}" for n in names)):
        (root / sub).mkdir(parents=True, exist_ok=True)
    conf = root / "slurm.conf"
    conf.write_text(_conf(root, names))
    env = dict(os.environ, SLURM_CONF=str(conf))
    slurm = Slurm(root, names, env)
    devnull = subprocess.DEVNULL
    ctld = ["slurmctld", "-D", "-i", "-f", str(conf)]
    slurm.daemons.append(subprocess.Popen(ctld, env=env, stdout=devnull, stderr=devnull))
    for name in names:
        # Each slurmd in its own PID namespace: its job steps see only that node's processes.
        cmd = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]
        cmd += ["slurmd", "-D", "-N", name, "-f", str(conf)]
        slurm.daemons.append(subprocess.Popen(cmd, env=env, stdout=devnull, stderr=devnull))
    try:
        slurm.wait_idle()
    except Exception:
        slurm.stop()
        raise
    return slurm


def submit_pp_job(slurm: Slurm, script: Path, port: int) -> str:
    """PP rank = node index, one per node, as SGLang's --node-rank; returns the job id."""
    import sys

    n = len(slurm.names)
    rank = f"{sys.executable} {script} --node-rank $SLURM_NODEID --pp $SLURM_NODEID"
    step = f"srun -N{n} --ntasks-per-node=1 bash -c '{rank} --pp-size {n} --port {port}'"
    out = slurm.run(
        "sbatch", "--parsable", f"-N{n}", "-o", str(slurm.root / "job.out"), "--wrap", step
    )
    return out.stdout.strip().split(";")[0]
