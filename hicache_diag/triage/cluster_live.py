"""`triage --live` across nodes: fan the collector out, merge the nodes' documents, judge them
with the same rule book as a local triage (triage/classify.py), and say which nodes are
missing; their ranks are never in the verdict, so never blamed."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from hicache_diag.cluster.base import Executor, Node, NodeResult, Sampling
from hicache_diag.cluster.fanout import fan_out
from hicache_diag.errors import UsageError
from hicache_diag.evidence.files import read_json
from hicache_diag.triage.classify import classify
from hicache_diag.triage.cluster_merge import (
    CLUSTER_FILE,
    CLUSTER_SCHEMA,
    ClusterSnapshot,
    merge,
    save_bundle,
)
from hicache_diag.triage.cluster_recorded import cluster_recording
from hicache_diag.triage.recorded_report import attach_recording
from hicache_diag.triage.report import TriageReport

LEAD_S = {"local": 0.3, "ssh": 1.5, "slurm": 2.0, "kubectl": 2.0}  # launch time before `at`


@dataclass(frozen=True, slots=True)
class ClusterTriage:
    executor: Executor
    samples: int = 2
    interval: float = 0.5
    deadline_s: float = 5.0
    host_timeout_s: float = 20.0
    save: Path | None = None
    num_heads: int | None = None
    pp_size: int | None = None


def snapshot(req: ClusterTriage) -> ClusterSnapshot:
    nodes = req.executor.resolve()
    if not nodes:
        raise UsageError(f"--via {req.executor.name}: no node to visit")
    lead = LEAD_S.get(req.executor.name, 1.0)
    at = time.time() + lead
    sampling = Sampling(at, req.samples, req.interval, req.deadline_s, req.host_timeout_s)
    snap = merge(fan_out(req.executor, nodes, sampling, req.host_timeout_s))
    if not snap.answered:
        said = "; ".join(f"{r.node.name}: {r.error}" for r in snap.missing)
        raise UsageError(f"no node answered ({said})")
    return snap


def run_cluster_triage(req: ClusterTriage) -> tuple[TriageReport, ClusterSnapshot]:
    snap = snapshot(req)
    if req.save:
        save_bundle(snap, req.save)
    return judge(snap, req.samples, req.num_heads, req.pp_size), snap


def reread_bundle(folder: Path) -> ClusterSnapshot | None:
    """A `--save` bundle's own cluster.json, merged again from the collectors' documents (the
    kernel states and missing nodes included); None when `folder` is no such bundle."""
    path = folder / CLUSTER_FILE
    if not path.is_file():  # a FIFO or device would be read forever
        return None
    try:
        data = read_json(path)  # bounded (evidence/files.py)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("schema") != CLUSTER_SCHEMA:
        return None
    docs = [d for d in data.get("documents") or [] if isinstance(d, dict)]
    results = [NodeResult(Node(str(d.get("node")), str(d.get("node"))), d) for d in docs]
    for name, error in (data.get("missing") or {}).items():
        results.append(NodeResult(Node(name, name), error=str(error)))
    return merge(results)


def judge(
    snap: ClusterSnapshot, samples: int, num_heads: int | None, pp_size: int | None
) -> TriageReport:
    recording = cluster_recording(snap)  # first: a rank py-spy could not read takes its dumps
    logs = recording.crashes if recording is not None else None
    report = classify(snap.ranks, logs, num_heads=num_heads, pp_size=pp_size)
    report.samples = max(report.samples, samples)
    report.evidence[:0] = cluster_evidence(snap)
    attach_recording(report, recording, live=False)
    if snap.missing and report.confidence == "high":
        report.confidence = "medium"  # the verdict is made without some nodes' ranks
    return report


def cluster_evidence(snap: ClusterSnapshot) -> list[str]:
    lines = [
        f"node {r.node.name} did not answer ({r.error}): its ranks are not judged, never blamed"
        for r in snap.missing
    ]
    names = ", ".join(r.node.name for r in snap.answered)
    skew = f"; sampled within {snap.skew_s * 1000:.0f} ms of each other" if snap.skew_s else ""
    lines.append(f"{len(snap.ranks)} scheduler(s) on {len(snap.answered)} node(s) ({names}){skew}")
    lines += [
        f"node {name} began {late:.2f} s after the agreed instant (its launch took longer)"
        for name, late in snap.late.items()
    ]
    # Only the ranks whose stack needed a fallback, or got none: at 1,000 ranks the rest is noise.
    lines += [n for n in snap.notes if not n.split(": ", 1)[-1].startswith("py-spy ok")]
    return lines
