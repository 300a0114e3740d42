"""A recording's in-process dumps as stacks, and a copied recording folder read as triage reads
it offline (`--record-dir`): the sessions, every rank's files, and the stacks of each rank's
answer to the last dump request (else its newest dump)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hicache_diag.errors import UsageError
from hicache_diag.evidence import recording as rec
from hicache_diag.evidence.ranks import RankId
from hicache_diag.evidence.recording_scan import RankRead, is_session, read_request, read_session
from hicache_diag.evidence.stacks import (
    Frame,
    RankDump,
    ThreadStack,
    parse_dump_text,
    threads_from_json,
)
from hicache_diag.triage.hang import RankSamples
from hicache_diag.triage.recorded import join


def _frame(text: str) -> Frame:
    """`file:line in func`, as the recorder's ThreadDump writes a frame."""
    where, _, name = text.rpartition(" in ")
    filename, _, line = where.rpartition(":")
    if not line.isdigit():
        filename, line = where, "0"
    return Frame(name or text, filename or "?", int(line))


def _thread(item: dict[str, Any]) -> ThreadStack:
    """One recorder ThreadDump (`frames` outermost first, as strings) as py-spy's innermost-
    first thread; its main thread named `MainThread`, whatever threading calls it."""
    frames = tuple(_frame(str(f)) for f in reversed(item.get("frames") or []))
    name = "MainThread" if item.get("main") else item.get("name")
    tid = item.get("native_id")
    return ThreadStack(name, None, frames, tid if isinstance(tid, int) else None)


def _threads(threads: Any, source: str) -> list[ThreadStack] | None:
    if isinstance(threads, str) and threads.strip():  # faulthandler's text
        found = parse_dump_text(threads, source)
        return found[0].threads if found else None
    if not (isinstance(threads, list) and threads and all(isinstance(t, dict) for t in threads)):
        return None
    if all(isinstance(f, str) for t in threads for f in t.get("frames") or []):
        return [_thread(t) for t in threads]
    return threads_from_json(threads)  # py-spy's JSON thread list


def dump_stack(doc: dict[str, Any], rank: RankId, pid: int | None, source: str) -> RankDump | None:
    """The dump's `threads` as one stack sample: the recorder's ThreadDumps
    (evidence/recording_dump.py), py-spy's JSON thread list, or faulthandler text; None when
    it holds none."""
    parsed = _threads(doc.get("threads"), source)
    if not parsed:
        return None
    title = doc.get("title") if isinstance(doc.get("title"), str) else None
    return RankDump(rank, pid, title, parsed, source)


def rank_id_of(rr: RankRead, node: str | None = None) -> RankId:
    if rr.meta is None:
        return RankId(anon=rr.rank, node=node)
    return RankId(rr.meta.pp_rank, rr.meta.tp_rank, node=node)


def dump_source(doc: dict[str, Any], pid: int | None) -> str:
    why = doc.get("reason") or "?"
    return f"pid {pid} in-process dump ({why})"


@dataclass(slots=True)
class Offline:
    sessions: list[Path]
    reads: dict[int, RankRead]
    request: dict[str, Any] | None
    notes: list[str] = field(default_factory=list)


def _sessions_of(folder: Path, notes: list[str]) -> list[Path]:
    if not folder.is_dir():
        raise UsageError(f"--record-dir {folder}: not a directory")
    if is_session(folder):
        return [folder]
    found = rec.sessions_in(folder)
    if not found:
        raise UsageError(f"--record-dir {folder}: no recording in it (no rank*.meta.json)")
    if len(found) > 1:
        notes.append(
            f"{len(found)} sessions under {folder}; read the newest, {found[0].name} (give a "
            "session's folder to read another)"
        )
    return found[:1]


def read_offline(folders: list[Path]) -> Offline:
    """Each folder a session or a record dir (its newest session); several folders (one per
    node) are one launch, joined by rank. A rank in two sessions: the later-started kept."""
    notes: list[str] = []
    sessions = [s for folder in folders for s in _sessions_of(folder, notes)]
    request = next((r for s in sessions if (r := read_request(s)) is not None), None)
    reads = join([read_session(s) for s in sessions], notes)
    return Offline(sessions, reads, request, notes)


def offline_stacks(off: Offline) -> list[RankSamples]:
    """Each rank's stack from its answer to the last request, or its newest dump."""
    asked = (off.request or {}).get("id")
    out = []
    for _, rr in sorted(off.reads.items()):
        pid = rr.meta.pid if rr.meta else None
        answers = [d for d in rr.dumps if asked and d.get("request") == asked] or rr.dumps[-1:]
        rank = rank_id_of(rr)
        rs = RankSamples(rank, pid)
        for doc in answers[-1:]:
            if (dump := dump_stack(doc, rank, pid, dump_source(doc, pid))) is not None:
                rs.dumps.append(dump)
                rs.title = dump.title
        if not rs.dumps:
            rs.error = "no in-process dump with stacks in its recording"
        out.append(rs)
    return out
