"""Reading a production recording back (evidence/recording.py): each rank's meta, digests,
blocks, full step lines and dumps as written; a file cut mid-record is read up to the cut.
Standard library only."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hicache_diag.evidence.recording_dump import DumpSnapshot
from hicache_diag.evidence.recording_files import (
    DIGEST,
    RankMeta,
    blocks_path,
    lines_path,
    meta_path,
)


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


def _json_lines(paths: Iterable[Path]) -> list[dict[str, Any]]:
    out = []
    for path in paths:
        if not path.is_file():
            continue
        for raw in path.read_bytes().splitlines():
            try:
                item = json.loads(raw)
            except ValueError:
                continue  # a line cut by a crash or a full disk
            if isinstance(item, dict):
                out.append(item)
    return out


def _digests(session: Path, rank: int) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for path in sorted(session.glob(f"rank{rank}.digest.*")):
        data = path.read_bytes()
        usable = len(data) - len(data) % DIGEST.size
        out += [DIGEST.unpack_from(data, i) for i in range(0, usable, DIGEST.size)]
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
    if meta_path(session, rank).is_file():
        try:
            meta = RankMeta.from_json(json.loads(meta_path(session, rank).read_text()))
        except (ValueError, TypeError):
            meta = None
    dumps = []
    for path in session.glob(f"rank{rank}.dump-*.json"):
        try:
            dumps.append(json.loads(path.read_text()))
        except ValueError:
            continue
    dumps.sort(key=lambda d: d.get("at") or 0)
    lines = _json_lines([lines_path(session, rank, older=True), lines_path(session, rank)])
    blocks = _json_lines([blocks_path(session, rank, older=True), blocks_path(session, rank)])
    return RecordedRank(rank, meta, _digests(session, rank), blocks, lines, dumps)


def read_session(session: Path) -> dict[int, RecordedRank]:
    return {r: read_rank(session, r) for r in ranks_in(session)}


def sessions_in(record_dir: Path) -> list[Path]:
    """The sessions under a record dir, newest first (a folder holding rank meta files)."""
    found = [p for p in record_dir.iterdir() if p.is_dir() and any(p.glob("rank*.meta.json"))]
    return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)
