"""`triage --live` across nodes (hicache_diag/cluster): the flags, and the run from them to a
rendered verdict. cli/triage.py hands over here when a cluster flag is given."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hicache_diag.cli.render.console import print_json
from hicache_diag.cli.render.triage import render_triage

Live = Annotated[
    bool,
    typer.Option(
        "--live",
        help="Sample every node's schedulers at one instant through --via (docs/cluster.md).",
    ),
]
Via = Annotated[
    str | None,
    typer.Option(
        "--via",
        metavar="EXECUTOR",
        help="local | ssh --hosts A,B | slurm --jobid J | kubectl --selector app=sglang; "
        "default: the one those flags (or $SLURM_JOB_ID) name, else local.",
    ),
]
TrialVia = Annotated[  # bisect's: where its trials run
    str | None,
    typer.Option(
        "--via",
        metavar="EXECUTOR",
        help="slurm: each trial a job step (srun) | ssh --hosts A,B: a trial per free host; "
        "--out on a path the nodes share (docs/cluster.md).",
    ),
]
Hosts = Annotated[
    str | None,
    typer.Option("--hosts", metavar="A,B", help="ssh hosts (your ssh config), or pod names."),
]
JobId = Annotated[
    str | None,
    typer.Option("--jobid", metavar="J", help="The running Slurm job (srun --overlap into it)."),
]
Selector = Annotated[
    str | None,
    typer.Option("--selector", metavar="LABEL=VALUE", help="kubectl: the pods' label selector."),
]
Namespace = Annotated[
    str | None, typer.Option("--namespace", "-n", metavar="NS", help="kubectl: namespace.")
]
Container = Annotated[
    str | None, typer.Option("--container", metavar="NAME", help="kubectl: the container.")
]
SshConfig = Annotated[str | None, typer.Option("--ssh-config", metavar="FILE", help="ssh -F FILE.")]
HostTimeout = Annotated[
    float,
    typer.Option("--host-timeout", metavar="SECONDS", help="Per node: a later answer is missing."),
]


def no_local_inputs(*given: object) -> None:
    from hicache_diag.errors import UsageError

    if any(given):
        raise UsageError("--live samples the nodes: not with --pid/--discover/--dumps/--logs")


def claim_save(save: str | None) -> None:
    """`--save DIR`, local or --live: a new or empty folder (output_paths.py), checked before
    anything is sampled; a second save into the same folder is refused, never merged over the
    first bundle (its file names come from the pids sampled, known only as it is written)."""
    from hicache_diag.evidence.output_paths import claim_dir

    claim_dir("--save", save, fresh=True, once="a --save bundle")


def wanted(live: bool, *flags: object) -> bool:
    return live or any(f is not None for f in flags)


def reread_bundle(dumps: list[str] | None, others: list, opts: dict, json_out: bool) -> None:
    """`--dumps DIR` alone, DIR a `--live --save` bundle: judged again from its collectors'
    documents (kernel states and missing nodes included), the verdict `--live` gave. Returns
    when DIR is no such bundle (the generic --dumps path reads it)."""
    from hicache_diag.triage.cluster_live import judge
    from hicache_diag.triage.cluster_live import reread_bundle as reread

    if not dumps or len(dumps) != 1 or any(others):
        return
    snap = reread(Path(dumps[0]))
    if snap is not None:
        _print(judge(snap, **opts), snap, json_out)


def _print(report, snap, json_out: bool) -> None:
    if json_out:
        doc = report.to_json()
        doc["nodes"] = {
            "answered": [r.node.name for r in snap.answered],
            "missing": {r.node.name: r.error for r in snap.missing},
            "skew_s": snap.skew_s,
        }
        print_json(doc)
    else:
        render_triage(report)
    raise typer.Exit(int(report.exit_code))


def run_cluster(flags: dict, opts: dict, json_out: bool) -> None:
    """`flags`: the cluster flags (detect.ClusterFlags's fields); `opts`: samples, interval,
    deadline_s, host_timeout_s, save, num_heads, pp_size."""
    from hicache_diag.cluster.detect import ClusterFlags, executor_for
    from hicache_diag.errors import UsageError
    from hicache_diag.triage.cluster_live import ClusterTriage, run_cluster_triage

    if opts["host_timeout_s"] <= 0:
        raise UsageError(f"--host-timeout must be > 0 (got {opts['host_timeout_s']})")
    save = opts.pop("save")
    claim_save(save)
    req = ClusterTriage(executor_for(ClusterFlags(**flags)), save=save and Path(save), **opts)
    _print(*run_cluster_triage(req), json_out)
