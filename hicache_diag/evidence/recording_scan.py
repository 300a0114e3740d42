"""A production recording read back for alignment (triage): recording.py's reader, except the
step digests, which come as two arrays (a day of serving is 4M steps a rank: 32 MB as arrays,
not 4M tuples). Reader only; standard library only, like the format itself.

Every file is read bounded, as recording_read.py reads it.
"""

from __future__ import annotations

import sys
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hicache_diag.evidence import recording as rec
from hicache_diag.evidence.recording_read import (
    MAX_DIGEST_BYTES,
    dump_time,
    is_block,
    is_step_line,
    json_lines,
    read_doc,
    read_or_none,
)


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


def read_digests(session: Path, rank: int) -> tuple[array, array]:
    """(steps, crcs) of every segment still on disk, oldest first; a record cut short at a
    segment's end (a crash mid-write) is left out, as recording.read_rank does."""
    words, left = array("I"), MAX_DIGEST_BYTES
    for path in sorted(session.glob(f"rank{rank}.digest.*"), reverse=True):  # newest first
        data = read_or_none(path, left) if left > 0 else None
        if data is None:
            break  # past the bound, or unreadable: the older segments would leave a gap
        left -= len(data)
        newer, words = words, array("I")
        words.frombytes(data[: len(data) - len(data) % rec.DIGEST.size])
        words.extend(newer)
    if sys.byteorder == "big":  # the format is little-endian
        words.byteswap()
    return words[0::2], words[1::2]


def read_meta(session: Path, rank: int) -> rec.RankMeta | None:
    doc = read_doc(rec.meta_path(session, rank))
    try:
        return rec.RankMeta.from_json(doc) if doc is not None else None
    except (ValueError, TypeError):
        return None


def read_dumps(session: Path, rank: int) -> list[dict[str, Any]]:
    docs = (read_doc(p) for p in session.glob(f"rank{rank}.dump-*.json"))
    return sorted((d for d in docs if d is not None), key=dump_time)


def read_rank(session: Path, rank: int) -> RankRead:
    steps, crcs = read_digests(session, rank)
    lines = json_lines([rec.lines_path(session, rank, older=True), rec.lines_path(session, rank)])
    blocks = json_lines(
        [rec.blocks_path(session, rank, older=True), rec.blocks_path(session, rank)]
    )
    lines, blocks = list(filter(is_step_line, lines)), list(filter(is_block, blocks))
    meta = read_meta(session, rank)
    dumps = read_dumps(session, rank)
    return RankRead(rank, meta, steps, crcs, blocks, lines, dumps, session.name)


def read_session(session: Path) -> dict[int, RankRead]:
    return {r: read_rank(session, r) for r in rec.ranks_in(session)}


def is_session(folder: Path) -> bool:
    return any(folder.glob("rank*.meta.json"))


def read_request(session: Path) -> dict[str, Any] | None:
    """The last dump request written into the session (triage's), or None."""
    return read_doc(session / rec.DUMP_REQUEST)
