"""A production recording read back for alignment (triage): recording.py's reader, except the
step digests, which come as two arrays (a day of serving is 4M steps a rank: 32 MB as arrays,
not 4M tuples). Reader only; standard library only, like the format itself.
"""

from __future__ import annotations

import json
import sys
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hicache_diag.evidence import recording as rec


@dataclass(slots=True)
class RankRead:
    """One rank's files: `steps[i]` was written with digest `crcs[i]`, oldest first."""

    rank: int
    meta: rec.RankMeta | None
    steps: array = field(default_factory=lambda: array("I"))
    crcs: array = field(default_factory=lambda: array("I"))
    blocks: list[dict[str, Any]] = field(default_factory=list)
    lines: list[dict[str, Any]] = field(default_factory=list)
    dumps: list[dict[str, Any]] = field(default_factory=list)
    session: str = ""  # the session folder's name

    @property
    def last_step(self) -> int | None:
        known = [int(self.steps[-1])] if self.steps else []
        known += [s for s in (ln.get("step") for ln in self.lines[-1:]) if isinstance(s, int)]
        return max(known) if known else (self.meta.last_step if self.meta else None)

    @property
    def first_held(self) -> int | None:
        """The oldest step whose full line is still held."""
        steps = [s for s in (ln.get("step") for ln in self.lines) if isinstance(s, int)]
        return min(steps) if steps else None


def _json_lines(paths: list[Path]) -> list[dict[str, Any]]:
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


def read_digests(session: Path, rank: int) -> tuple[array, array]:
    """(steps, crcs) of every segment still on disk, oldest first; a record cut short at a
    segment's end (a crash mid-write) is left out, as recording.read_rank does."""
    words = array("I")
    for path in sorted(session.glob(f"rank{rank}.digest.*")):
        data = path.read_bytes()
        words.frombytes(data[: len(data) - len(data) % rec.DIGEST.size])
    if sys.byteorder == "big":  # the format is little-endian
        words.byteswap()
    return words[0::2], words[1::2]


def read_meta(session: Path, rank: int) -> rec.RankMeta | None:
    path = rec.meta_path(session, rank)
    if not path.is_file():
        return None
    try:
        return rec.RankMeta.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def read_dumps(session: Path, rank: int) -> list[dict[str, Any]]:
    out = []
    for path in session.glob(f"rank{rank}.dump-*.json"):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # one being replaced, or cut short
        if isinstance(doc, dict):
            out.append(doc)
    return sorted(out, key=lambda d: d.get("at") or 0)


def read_rank(session: Path, rank: int) -> RankRead:
    steps, crcs = read_digests(session, rank)
    lines = _json_lines([rec.lines_path(session, rank, older=True), rec.lines_path(session, rank)])
    blocks = _json_lines(
        [rec.blocks_path(session, rank, older=True), rec.blocks_path(session, rank)]
    )
    meta = read_meta(session, rank)
    dumps = read_dumps(session, rank)
    return RankRead(rank, meta, steps, crcs, blocks, lines, dumps, session.name)


def read_session(session: Path) -> dict[int, RankRead]:
    return {r: read_rank(session, r) for r in rec.ranks_in(session)}


def is_session(folder: Path) -> bool:
    return any(folder.glob("rank*.meta.json"))


def read_request(session: Path) -> dict[str, Any] | None:
    """The last dump request written into the session (triage's), or None."""
    try:
        doc = json.loads((session / rec.DUMP_REQUEST).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None
