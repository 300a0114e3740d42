"""The slurm executor: `srun --overlap --jobid J --nodelist NODE` into the hung job's own
allocation (a job step beside the stuck one; no new allocation, nothing queued)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

from hicache_diag.cluster.base import Executor, Node
from hicache_diag.errors import UsageError


def _slurm(cmd: list[str], what: str) -> str:
    if shutil.which(cmd[0]) is None:
        raise UsageError(f"--via slurm: {cmd[0]} not found (run on a Slurm login or compute node)")
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        raise UsageError(f"{what}: {cmd[0]} did not answer in 20 s (slurmctld down?)") from None
    if done.returncode != 0:
        err = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise UsageError(f"{what}: {err}")
    return done.stdout


@dataclass(slots=True)
class SlurmExecutor(Executor):
    jobid: str = ""

    def __post_init__(self) -> None:
        self.name = "slurm"
        if not self.jobid.isdigit():
            raise UsageError(f"--jobid {self.jobid!r}: give the number of a running Slurm job")

    def resolve(self) -> list[Node]:
        what = f"--jobid {self.jobid}"
        out = _slurm(["squeue", "-h", "-j", self.jobid, "-o", "%T|%N"], what).strip()
        if not out:
            raise UsageError(f"{what}: no such job in the queue (finished or never started)")
        state, _, nodelist = out.splitlines()[0].partition("|")
        if state != "RUNNING":
            raise UsageError(f"{what}: the job is {state.lower()}, not running")
        names = _slurm(["scontrol", "show", "hostnames", nodelist], what).split()
        wanted = {n.address for n in self.nodes}
        picked = [n for n in names if not wanted or n in wanted]
        if wanted and len(picked) != len(wanted):
            raise UsageError(f"{what}: --hosts names nodes outside the job ({nodelist})")
        return [Node(n, n) for n in picked]

    def argv(self, node: Node, remote: list[str]) -> list[str]:
        step = ["--overlap", "--jobid", self.jobid, "--nodelist", node.address]
        step += ["--nodes=1", "--ntasks=1", "--quiet", "--job-name=hicache-diag-collector"]
        return ["srun", *step, *remote]

    def explain(self, node: Node, returncode: int | None, stderr: str) -> str:
        lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
        err = next((ln for ln in lines if "error" in ln.lower()), lines[-1] if lines else "")
        if "python3" in err and ("no such file" in err.lower() or "not found" in err.lower()):
            return f"srun {node.address}: no python3 on the node"
        return f"srun {node.address}: {err or f'exit status {returncode}'}"
