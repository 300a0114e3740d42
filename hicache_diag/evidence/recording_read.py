"""Reading a production recording back (evidence/recording.py): each rank's meta, digests,
blocks, full step lines and dumps as written; a file cut mid-record is read up to the cut.
Standard library only.

A record dir is input (copied from a node, or damaged): every file is read through
evidence/files.py (regular files only, never blocking on a FIFO, bounded in bytes and JSON
depth); what cannot be read is left out as a file cut short is."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hicache_diag.evidence import files
from hicache_diag.evidence.recording_dump import DumpSnapshot
from hicache_diag.evidence.recording_files import (
    DIGEST,
    RankMeta,
    blocks_path,
    lines_path,
    meta_path,
)

# The writer keeps 2 x 4 MiB of lines and 8 x 4 MiB of digests a rank by default; bounds well
# past any configured recording, the newest data kept where one is reached.
MAX_LINES_BYTES = files.MAX_JSON_BYTES  # per file, read from its end
MAX_DIGEST_BYTES = files.MAX_STEPS_BYTES  # all of a rank's segments together


@dataclass(slots=True)
class RecordedRank:
    """What one rank's recording holds, as read back (a file cut mid-record is read up to it)."""

    rank: int
    meta: RankMeta | None
    digests: list[tuple[int, int]]  # (step, crc), oldest first
    blocks: list[dict[str, Any]]
    lines: list[dict[str, Any]]  # full step lines still held, oldest first
    dumps: list[dict[str, Any]]  # oldest first

    @property
    def last_step(self) -> int | None:
        steps = [s for s, _ in self.digests[-1:]] + [ln.get("step") for ln in self.lines[-1:]]
        known = [s for s in steps if isinstance(s, int)]
        return max(known) if known else (self.meta.last_step if self.meta else None)

    @property
    def snapshots(self) -> list[DumpSnapshot]:
        """The dumps as records, oldest first."""
        return [DumpSnapshot.from_json(d) for d in self.dumps]


def read_or_none(path: Path, limit: int, tail: bool = False) -> bytes | None:
    """`path`'s bytes (files.read_bytes), or None where it is missing or cannot be read."""
    try:
        return files.read_bytes(path, limit, tail)
    except (OSError, ValueError):
        return None


def json_lines(paths: list[Path]) -> list[dict[str, Any]]:
    """The objects of JSON-lines files, oldest file first; a line cut by a crash or a full disk,
    or one that is not a bounded JSON object, is left out."""
    out = []
    for path in paths:
        data = read_or_none(path, MAX_LINES_BYTES, tail=True)
        if data is None:
            continue
        if len(data) == MAX_LINES_BYTES:  # read from its end: the first line may be cut
            data = data.split(b"\n", 1)[-1]
        for raw in data.splitlines():
            try:
                item = files.loads(raw)
            except (ValueError, RecursionError):
                continue
            if isinstance(item, dict):
                out.append(item)
    return out


def is_step_line(item: dict[str, Any]) -> bool:
    """A step line its readers can walk: a step number, the must-agree fields a list of names.
    Other values are compared as written (a release's recorder may write its own shapes)."""
    agree = item.get("must_agree")
    if not isinstance(item.get("step"), int) or not isinstance(agree, (list, type(None))):
        return False
    return all(isinstance(k, str) for k in agree or ())


def is_block(item: dict[str, Any]) -> bool:
    """A block line as the writer writes it: figures where its readers count, crcs by field."""
    figures = all(isinstance(item.get(k), int) for k in ("block", "first", "last", "n"))
    return figures and isinstance(item.get("f"), dict)


def read_doc(path: Path) -> dict[str, Any] | None:
    """A JSON object file (a meta, a dump, a request), bounded; None where it is not one."""
    data = read_or_none(path, files.MAX_JSON_BYTES)
    try:
        doc = files.loads(data) if data is not None else None
    except ValueError:
        return None  # being replaced, cut short, or damaged
    return doc if isinstance(doc, dict) else None


def _digests(session: Path, rank: int) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    left = MAX_DIGEST_BYTES
    for path in sorted(session.glob(f"rank{rank}.digest.*"), reverse=True):  # newest first
        data = read_or_none(path, left) if left > 0 else None
        if data is None:
            break  # past the bound, or unreadable: the older segments would leave a gap
        left -= len(data)
        usable = len(data) - len(data) % DIGEST.size
        out[:0] = [DIGEST.unpack_from(data, i) for i in range(0, usable, DIGEST.size)]
    return out


def ranks_in(session: Path) -> list[int]:
    found = set()
    for path in session.glob("rank*.*"):
        head = path.name.split(".", 1)[0].removeprefix("rank")
        if head.isdigit():
            found.add(int(head))
    return sorted(found)


def read_rank(session: Path, rank: int) -> RecordedRank:
    meta = None
    if (doc := read_doc(meta_path(session, rank))) is not None:
        try:
            meta = RankMeta.from_json(doc)
        except (ValueError, TypeError):
            meta = None
    dumps = [d for d in map(read_doc, session.glob(f"rank{rank}.dump-*.json")) if d is not None]
    dumps.sort(key=dump_time)
    lines = json_lines([lines_path(session, rank, older=True), lines_path(session, rank)])
    blocks = json_lines([blocks_path(session, rank, older=True), blocks_path(session, rank)])
    lines, blocks = list(filter(is_step_line, lines)), list(filter(is_block, blocks))
    return RecordedRank(rank, meta, _digests(session, rank), blocks, lines, dumps)


def dump_time(doc: dict[str, Any]) -> float:
    at = doc.get("at")
    return float(at) if isinstance(at, (int, float)) else 0.0


def read_session(session: Path) -> dict[int, RecordedRank]:
    return {r: read_rank(session, r) for r in ranks_in(session)}


def sessions_in(record_dir: Path) -> list[Path]:
    """The sessions under a record dir, newest first (a folder holding rank meta files)."""
    found = [p for p in record_dir.iterdir() if p.is_dir() and any(p.glob("rank*.meta.json"))]
    return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)
