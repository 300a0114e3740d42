"""Nodes' collector documents -> the rank samples triage judges (the same RankSamples the
local live path builds), with the node in every rank; and the bundle `--save` writes, which
`triage --dumps DIR` reads back."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hicache_diag.cluster.base import NodeResult
from hicache_diag.evidence.ranks import RankId, rank_from_title
from hicache_diag.evidence.stacks import RankDump, threads_from_json
from hicache_diag.rules.rank_fate import RankFate
from hicache_diag.triage.hang import RankSamples

CLUSTER_SCHEMA = "hicache-diag/cluster/v1"
CLUSTER_FILE = "cluster.json"  # the nodes, who answered, the skew (no stacks: --dumps skips it)
_TICKS = 100  # USER_HZ on Linux


@dataclass(slots=True)
class ClusterSnapshot:
    ranks: list[RankSamples] = field(default_factory=list)
    answered: list[NodeResult] = field(default_factory=list)
    missing: list[NodeResult] = field(default_factory=list)
    skew_s: float | None = None  # spread of the nodes' first-sample instants
    notes: list[str] = field(default_factory=list)  # the fallback links used, per rank
    late: dict[str, float] = field(default_factory=dict)  # node -> s after the agreed instant


def _fate(state: str) -> RankFate:
    if state[:1] in ("T", "t"):
        return RankFate.STOPPED
    return RankFate.EXITED if state in ("gone", "Z (zombie)", "X (dead)") else RankFate.ALIVE


def _links(sample: dict[str, Any]) -> str:
    tried = []
    for x in sample.get("links") or []:
        tried.append(f"{x['link']} {'ok' if x['ok'] else 'failed: ' + str(x['error'])}")
    return "; ".join(tried)


def _rank_samples(node: str, proc: dict[str, Any], anon: int) -> RankSamples:
    title = str(proc.get("title") or "")
    rank = replace(rank_from_title(title) or RankId(anon=anon), node=node)
    rs = RankSamples(rank, proc.get("pid"), title)
    samples = proc.get("samples") or []
    for n, sample in enumerate(samples):
        threads = sample.get("threads")
        if isinstance(threads, list) and threads:
            src = f"{node} pid {rs.pid} sample {n}"
            rs.dumps.append(RankDump(rank, rs.pid, title, threads_from_json(threads), src))
            rs.raw.append(threads)
    facts = [s.get("proc") or {} for s in samples]
    if facts:
        rs.fate = _fate(str(facts[-1].get("state") or ""))
        ticks = [f.get("cpu_ticks") for f in facts]
        wall = (samples[-1].get("t") or 0) - (samples[0].get("t") or 0)
        if len(samples) > 1 and None not in ticks and wall > 0:
            rs.cpu_fraction = round((ticks[-1] - ticks[0]) / _TICKS / wall, 3)
    if not rs.dumps:
        last = facts[-1] if facts else {}
        rs.error = f"no stack ({_links(samples[-1]) if samples else 'not sampled'}); " + (
            f"state {last.get('state')}, wchan {last.get('wchan')}"
        )
    return rs


def merge(results: list[NodeResult]) -> ClusterSnapshot:
    snap = ClusterSnapshot()
    firsts = []
    for res in results:
        if not res.ok:
            snap.missing.append(res)
            continue
        snap.answered.append(res)
        doc = res.doc or {}
        if doc.get("samples_at"):
            firsts.append(float(doc["samples_at"][0]))
            if (late := firsts[-1] - float(doc.get("at") or firsts[-1])) > 0.1:
                snap.late[res.node.name] = round(late, 3)
        for i, proc in enumerate(doc.get("processes") or []):
            rs = _rank_samples(res.node.name, proc, i)
            snap.ranks.append(rs)
            samples = proc.get("samples") or []
            if samples:
                snap.notes.append(f"{rs.rank.label} (pid {rs.pid}): {_links(samples[-1])}")
    if len(firsts) > 1:
        snap.skew_s = round(max(firsts) - min(firsts), 3)
    snap.ranks.sort(key=lambda rs: rs.rank.key)
    return snap


def save_bundle(snap: ClusterSnapshot, folder: Path) -> None:
    """One py-spy JSON envelope per rank and sample (node in it), and cluster.json, each
    written whole (output_paths.write_atomic; the folder was claimed before sampling)."""
    from hicache_diag.evidence.output_paths import write_atomic

    for rs in snap.ranks:
        for n, raw in enumerate(rs.raw):
            name = f"{rs.rank.label.replace(' ', '_')}_pid{rs.pid}_s{n}.json"
            body = {"pid": rs.pid, "title": rs.title, "rank": rs.rank.label, "node": rs.rank.node}
            body |= {"sample": n, "tool": "hicache-diag collector", "threads": raw}
            write_atomic(folder / name, json.dumps(body, indent=1))
    nodes = {
        "schema": CLUSTER_SCHEMA,
        "answered": [r.node.name for r in snap.answered],
        "missing": {r.node.name: r.error for r in snap.missing},
        "skew_s": snap.skew_s,
        "documents": [r.doc for r in snap.answered],
    }
    write_atomic(folder / CLUSTER_FILE, json.dumps(nodes, indent=1))
