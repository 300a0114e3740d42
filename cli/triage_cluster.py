"""`triage --live` across nodes (hicache_diag/cluster): the run from its flags (declared and
checked in cli/triage_flags.py) to a rendered verdict. cli/triage.py hands over here when a
cluster flag is given."""

from __future__ import annotations

from pathlib import Path

import typer

from hicache_diag.cli.render.console import print_json
from hicache_diag.cli.render.triage import render_triage


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
    from hicache_diag.triage.cluster_live import ClusterTriage, run_cluster_triage

    save = opts.pop("save")
    req = ClusterTriage(executor_for(ClusterFlags(**flags)), save=save and Path(save), **opts)
    _print(*run_cluster_triage(req), json_out)
