"""`bisect --via slurm` / `--via ssh --hosts A,B`: every trial run on the cluster through one
seam, its run dir on the shared path bisect reads.

Hooks in as bisect's trial function (BisectConfig.trial, "module:function"): the local trial
process (trials/bisect_child.py) calls `run_trial`, which hands the same plan with the real
trial function to `python -m hicache_diag.trials.bisect_child PLAN` on the cluster (slurm: a
job step, `srun -N1 -n1`, inside an allocation a step of it, else a one-step job of its own;
ssh: the first free host of `--hosts`, one trial per host at a time) and returns the verdict
that wrote. A trial that ends without a verdict (a host lost or unreachable, a step cancelled,
killed) is an error of the trial, listed with the errors, never a pass. Needs this interpreter
and the `--out` folder at the same paths on the nodes (a shared filesystem)."""

from __future__ import annotations

import collections
import fcntl
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from hicache_diag.cluster.base import LIFELINE, Node
from hicache_diag.cluster.detect import ClusterFlags, detect
from hicache_diag.cluster.ssh import SshExecutor, parse_hosts, probe
from hicache_diag.errors import HicacheDiagError, UsageError

TRIAL = "hicache_diag.trials.remote_trials:run_trial"
REAL_TRIAL = "hicache_diag.engines.registry:run_trial"  # trials/bisect_trials.py's TRIAL
CHILD = "hicache_diag.trials.bisect_child"
PLACES = ".trial-hosts"  # in bisect's --out: where trials run (places.json) and host locks
FREE_HOST_POLL_S = 0.2


@dataclass(frozen=True, slots=True)
class TrialPlaces:
    """How the trials leave this machine: written by `via`, read by every trial process."""

    via: str  # slurm | ssh
    hosts: tuple[str, ...] = ()
    ssh_config: str | None = None
    cwd: str = ""
    python: str = sys.executable

    def save(self, out: Path) -> None:
        (out / PLACES).mkdir(parents=True, exist_ok=True)
        (out / PLACES / "places.json").write_text(json.dumps(asdict(self)))

    @staticmethod
    def load(out: Path) -> TrialPlaces:
        data = json.loads((out / PLACES / "places.json").read_text())
        return TrialPlaces(**{**data, "hosts": tuple(data["hosts"])})

    def ssh(self) -> SshExecutor:
        return SshExecutor(nodes=[Node(h, h) for h in self.hosts], config=self.ssh_config)


def via(cfg: Any, executor: str | None, hosts: str | None, ssh_config: str | None) -> Any:
    """The bisect config with its trials sent through `executor` (`--hosts` alone: ssh); bad
    input (no srun, an unknown or unreachable host) is one line before any trial starts."""
    name = detect(ClusterFlags(via=executor, hosts=hosts, ssh_config=ssh_config))
    if name not in ("slurm", "ssh"):
        raise UsageError(f"bisect --via {name}: trials run through slurm or ssh --hosts A,B")
    if ssh_config and name != "ssh":
        raise UsageError(f"--ssh-config is for --via ssh, not {name}")
    if name == "slurm":
        if hosts:
            raise UsageError("--hosts is for --via ssh (slurm places each step itself)")
        if shutil.which("srun") is None:
            raise UsageError("bisect --via slurm: srun not found (run on a Slurm login node)")
        places = TrialPlaces("slurm", cwd=str(Path.cwd()))
    else:
        places = TrialPlaces("ssh", _reachable(hosts, ssh_config), ssh_config, str(Path.cwd()))
    places.save(cfg.out)
    jobs = len(places.hosts) if places.hosts else cfg.jobs  # ssh: one trial per host at once
    return replace(cfg, trial=TRIAL, jobs=jobs)


def _reachable(hosts: str | None, ssh_config: str | None) -> tuple[str, ...]:
    """Every host answers `ssh HOST true` (in parallel), or the first that does not is named."""
    if not hosts:
        raise UsageError("bisect --via ssh needs --hosts HOST[,HOST...]")
    if shutil.which("ssh") is None:
        raise UsageError("bisect --via ssh: no ssh client (install openssh-client)")
    executor = SshExecutor(nodes=parse_hosts(hosts), config=ssh_config)
    errors = [why for _, why, _ in probe(executor, ["true"]) if why]
    if errors:
        raise UsageError(f"--hosts: {errors[0]}")
    return tuple(n.address for n in executor.nodes)


def step_argv(plan: Path, python: str = sys.executable) -> list[str]:
    step = ["srun", "-N1", "-n1", "--quiet", "--job-name=hicache-diag-trial", "--kill-on-bad-exit"]
    return [*step, python, "-m", CHILD, str(plan)]


def ssh_argv(places: TrialPlaces, host: str, plan: Path) -> list[str]:
    """`ssh HOST python -c LIFELINE CWD python -m bisect_child PLAN`, the user's ssh config."""
    remote = [places.python, "-c", LIFELINE, places.cwd, places.python, "-m", CHILD, str(plan)]
    return places.ssh().argv(Node(host, host), remote)


@contextmanager
def free_host(places: TrialPlaces, out: Path) -> Iterator[str | None]:
    """The first host no other trial holds (a lock file per host under --out), held until the
    trial ends; None for slurm (it places the step itself)."""
    if not places.hosts:
        yield None
        return
    while True:
        for host in places.hosts:
            fh = open(out / PLACES / f"{host}.lock", "w")  # noqa: SIM115 - held while in use
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                fh.close()
                continue
            try:
                yield host
            finally:
                fh.close()
            return
        time.sleep(FREE_HOST_POLL_S)


def _launch(places: TrialPlaces, host: str | None, plan: Path) -> tuple[int, str]:
    """Run the trial there; (exit status, why it might have been lost). Our stdout/stderr are
    the trial's log: the launcher's (and the trial's) lines are passed through."""
    if host is None:
        rc = subprocess.run(step_argv(plan, places.python), stdin=subprocess.DEVNULL).returncode
        return rc, f"the slurm step ended without a verdict (srun exit {rc})"
    print(f"hicache-diag: trial on {host} (ssh)", file=sys.stderr, flush=True)
    # stdin stays open (never written) while this process lives: the host's lifeline.
    argv = ssh_argv(places, host, plan)
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    tail: collections.deque[str] = collections.deque(maxlen=20)
    for line in proc.stderr:
        sys.stderr.buffer.write(line)
        sys.stderr.flush()
        tail.append(line.decode(errors="replace"))
    rc = proc.wait()
    proc.stdin.close()
    if rc == 255:  # ssh's own failure: the host, the key, the link
        why = places.ssh().explain(Node(host, host), rc, "".join(tail))
    else:
        why = f"it ended without a verdict (exit status {rc})"
    return rc, f"trial lost on {host}: {why}"


def run_trial(config: Any, argv: list[str]) -> Any:
    from hicache_diag.trials.bisect_child import TrialPlan
    from hicache_diag.trials.bisect_trials import read_verdict
    from hicache_diag.trials.trial import TrialResult

    out = Path(str(config.out))
    root = out.parents[1]  # bisect's --out: cell dir, then trial dir (trials/bisect.py _plan)
    places = TrialPlaces.load(root)
    plan = out.parent / f"{out.name}.remote.plan"
    TrialPlan(REAL_TRIAL, config, tuple(argv)).save(plan)
    try:
        with free_host(places, root) as host:
            rc, lost = _launch(places, host, plan)
    finally:
        plan.unlink(missing_ok=True)
    verdict = read_verdict(out)
    if verdict is None:
        raise HicacheDiagError(lost)
    return TrialResult(verdict, out)
