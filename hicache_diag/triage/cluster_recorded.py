"""The nodes' recordings (`triage --live --via`): each collector ships the sessions of the
schedulers it found (collector.ship: each rank's newest lines, blocks and digests, its dumps),
unpacked here into a scratch folder and read as a local recording, joined by rank across the
nodes; the ranks py-spy could not read there take their in-process dumps as stacks."""

from __future__ import annotations

import base64
import binascii
import re
import tempfile
import zlib
from pathlib import Path
from typing import Any

from hicache_diag.evidence.recording_scan import RankRead, read_session
from hicache_diag.triage.cluster_merge import ClusterSnapshot
from hicache_diag.triage.hang import RankSamples
from hicache_diag.triage.recorded import Facts, Recording, join, read_recording
from hicache_diag.triage.recorded_dumps import dump_source, dump_stack

_NAME = re.compile(r"rank\d+\.[\w.-]+")  # only the recording's own file names are written
_SAFE = re.compile(r"[^\w.-]")
_QUIET = {"T": "stopped (kernel state T)", "t": "stopped by a tracer", "D": "in the kernel (D)"}
MAX_UNPACKED = 256 << 20  # per document: a collector never ships more (collector.SHIP)


def _unpack(doc: dict[str, Any], folder: Path) -> list[Path]:
    """Each shipped session as a folder under `folder`; a name or payload that is not one of
    the recording's is skipped."""
    out, left = [], MAX_UNPACKED
    for i, shipped in enumerate(doc.get("recordings") or []):
        session = folder / f"{i}-{_SAFE.sub('_', str(shipped.get('name')))}"
        session.mkdir(parents=True)
        for name, packed in (shipped.get("files") or {}).items():
            if not (isinstance(name, str) and _NAME.fullmatch(name) and isinstance(packed, str)):
                continue
            if left <= 0:
                break
            try:
                data = zlib.decompressobj().decompress(base64.b64decode(packed), left)
            except (binascii.Error, zlib.error, ValueError):
                continue
            left -= len(data)
            (session / name).write_bytes(data)
        out.append(session)
    return out


def _silent(proc: dict[str, Any]) -> str | None:
    samples = proc.get("samples") or []
    state = str(((samples[-1] if samples else {}).get("proc") or {}).get("state") or "gone")
    if state == "gone" or state[:1] in "ZX":
        return f"its process has exited ({state})"
    if state[:1] in _QUIET:
        return f"its process is {_QUIET[state[:1]]}: it runs no code of its own"
    return None


def _answers(rr: RankRead, asked: list[str]) -> list[dict[str, Any]]:
    return [d for d in rr.dumps if d.get("request") in asked]


def _node_reads(doc: dict[str, Any], folder: Path) -> tuple[list[dict[int, RankRead]], list]:
    """One node's sessions read back, and the dump requests its collector wrote."""
    sessions, asked = [], []
    for shipped, session in zip(doc.get("recordings") or [], _unpack(doc, folder), strict=True):
        asked += [a for a in shipped.get("asked") or [] if isinstance(a, str)]
        got = read_session(session)
        for rr in got.values():
            rr.session = str(shipped.get("name") or session.name)
        sessions.append(got)
    return sessions, asked


def _facts(docs: list, reads: dict[int, RankRead], node_of: dict, asked: list[str]) -> Facts:
    """Who answered the collectors' requests, and why a rank could not (its kernel state)."""
    facts = Facts(asked=asked[-1] if asked else None)
    facts.answered = {r for r, rr in reads.items() if _answers(rr, asked)}
    why = {
        (n, p.get("pid")): w for n, d in docs for p in d.get("processes") or [] if (w := _silent(p))
    }
    for r, rr in reads.items():
        if rr.meta and (said := why.get((node_of.get(r), rr.meta.pid))):
            facts.silent[r] = said
    return facts


def _pairs(snap: ClusterSnapshot, reads: dict[int, RankRead]) -> list[tuple[int, RankSamples]]:
    """(rank, its samples): the live rank whose pid, PP and TP its meta names."""
    key = {(rr.meta.pid, rr.meta.pp_rank, rr.meta.tp_rank): r for r, rr in reads.items() if rr.meta}
    found = [(key.get((rs.pid, rs.rank.pp, rs.rank.tp)), rs) for rs in snap.ranks]
    return [(r, rs) for r, rs in found if r is not None]


def _use_dumps(snap: ClusterSnapshot, reads: dict[int, RankRead], asked: list[str]) -> list[str]:
    """A rank with no stack from any link takes its answers (oldest first) as its samples."""
    used = []
    for r, rs in _pairs(snap, reads):
        rr = reads[r]
        if rs.dumps:
            continue
        for doc in _answers(rr, asked):
            if (dump := dump_stack(doc, rs.rank, rs.pid, dump_source(doc, rs.pid))) is not None:
                rs.dumps.append(dump)
        if rs.dumps:
            used.append(rs.rank.label)
            rs.error = None
    return used


def cluster_recording(snap: ClusterSnapshot) -> Recording | None:
    """Every answering node's recordings, joined by rank, with the nodes' process facts."""
    docs = [(r.node.name, r.doc or {}) for r in snap.answered if (r.doc or {}).get("recordings")]
    if not docs:
        return None
    per_node, asked, notes = [], [], []
    with tempfile.TemporaryDirectory(prefix="hicache-diag-recordings-") as scratch:
        for i, (node, doc) in enumerate(docs):
            sessions, wrote = _node_reads(doc, Path(scratch) / str(i))
            per_node += [(node, got) for got in sessions]
            asked += wrote
    reads = join([got for _, got in per_node], notes)
    node_of = {r: n for n, got in per_node for r, rr in got.items() if reads.get(r) is rr}
    facts = _facts(docs, reads, node_of, asked)
    facts.live = {(rs.rank.pp, rs.rank.tp): rs.pid for rs in snap.ranks if rs.rank.known}
    facts.expected = set(facts.live)
    used = _use_dumps(snap, reads, asked)
    facts.stacks = {r: rs.dumps[-1] for r, rs in _pairs(snap, reads) if rs.dumps}
    sessions = sorted({rr.session for rr in reads.values()})
    recording = read_recording(reads, sessions, facts)
    for r in recording.ranks:
        r.node = node_of.get(r.rank) if r.rank is not None else None
    recording.evidence += notes
    if used:
        recording.evidence.append(
            "stacks from the ranks' in-process dumps (no ptrace needed), where no link of the "
            f"collector could read them: {', '.join(used)}"
        )
    return recording
