"""Record a TextBlock (logs/textblock.py) as logs/blocks.py records a Block, at C speed: counts
come from the lines' shape ids, the figures that differ from line to line (a rank's, an access
line's status) are gathered at the columns their shape gives (numpy over the block's bytes),
and only the few lines the evidence keeps are cut out as strings: each rank's last line, the
last progress lines, the block's last line. tests/unit/triage/test_quiet.py checks it against
reading the same lines one by one.

The progress lines a block keeps are cut out only when asked (`Pending`): in a busy log each
block's last progress lines replace the last block's, so only the final ones are ever made.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from hicache_diag.logs.incidents import INCIDENT_GAP_S, gap_s
from hicache_diag.logs.model import KEEP_PROGRESS, LogEvidence, ReadCtx
from hicache_diag.logs.shapes import SERVED
from hicache_diag.logs.textblock import TextBlock, TextShape
from hicache_diag.rules.signatures import Context

Bracket = Callable[[str], "tuple | None"]  # logs/parse.py's _bracket: (stamp, rank, has PP)


@dataclass(slots=True)
class _Lines:
    """A block's lines by index: their bounds in its text, their shapes."""

    block: TextBlock
    starts: object  # numpy arrays of each line's first offset and its newline's
    ends: object
    bracket: Bracket

    @classmethod
    def of(cls, block: TextBlock, bracket: Bracket) -> _Lines:
        """A line is as long as its shape: the offsets come from the ids (no search for
        newlines)."""
        import numpy as np

        lengths = np.array(block.lengths, dtype=np.int64)[block.ids]
        ends = np.cumsum(lengths) - 1
        return cls(block, ends - lengths + 1, ends, bracket)

    def info(self, n: int) -> TextShape:
        return self.block.infos[self.block.ids[n]]

    def text(self, n: int) -> str:
        return self.block.data[self.starts[n] : self.ends[n]].decode("ascii")  # type: ignore[index]

    def head(self, n: int) -> tuple[str, object, str]:
        """Line n's (stamp, rank, message)."""
        line, info = self.text(n), self.info(n)
        stamp, rank, _ = self.bracket(line[info.inside])  # type: ignore[misc]
        msg = line[info.inside.stop + 1 :]
        return stamp, rank, msg[1:] if msg[:1].isspace() else msg


@dataclass(slots=True)
class Pending:
    """A block's last progress lines, not yet cut out: (rank, stamp, source, lineno, text)
    tuples on `items()`."""

    lines: _Lines
    picked: list[int]  # their indices in the block
    base: int  # the block's first line's stream index
    source: str

    def items(self) -> list[tuple]:
        out = []
        for n in self.picked:
            stamp, rank, msg = self.lines.head(n)
            out.append((rank, stamp, self.source, self.base + n + 1, msg))
        return out


def record_text(
    block: TextBlock,
    i: int,
    source: str,
    ctx: ReadCtx,
    ev: LogEvidence,
    last_seen: dict,
    bracket: Bracket,
    latest: str | None,
    held: Pending | None,
) -> tuple[int, Pending | None]:
    """Record block's lines (stream index i on) up to the first the full path must read (a
    trigger, HiCache's name while the context lacks it, a label without a full stamp); return
    how many, and the progress lines the caller holds from now (`held`: those it held, which
    come after ev.recent_progress, itself empty while any are held). 0 when the block must be
    read as a Block: its first line needs the full path, or a stamp in it is more than
    INCIDENT_GAP_S past `latest` (the latest stamp before it: a silence may split it into two
    incidents, logs/incidents.py; no line of it can if none is)."""
    import numpy as np  # here: a log too small to make a TextBlock never pays for the import

    infos, idarr, present, counts = block.infos, block.ids, block.present, block.counts
    stop = _stop(block, ev)
    if stop == 0:
        return 0, held
    data, lines = _Words(block.data), _Lines.of(block, bracket)
    if stop < len(idarr):
        idarr = idarr[:stop]
        counts = np.bincount(idarr)
        present = np.flatnonzero(counts).tolist()
    groups = {k: np.flatnonzero(idarr == k) for k in present}  # each shape's lines, ascending
    newest = _newest(lines, data, groups)
    if gap_s(latest, newest) > INCIDENT_GAP_S:
        return 0, held
    ev.recognised += stop
    ev.labelled += stop
    if not ev.context.pp and any(infos[k].pp for k in present):
        ev.context = ev.context | Context(pp=True)
    if ctx.noise_next and any(infos[k].says for k in present):
        ctx.noise_next = False
    ev.served += _served(data, lines.starts, groups, infos)
    for n in _rank_lasts(data, lines.starts, groups, infos):
        stamp, rank, msg = lines.head(n)
        if rank is not None:  # in line order: a rank's later line (another shape's) wins
            last_seen[id(rank)] = (rank, stamp, i + n + 1, msg)
    held = _progress(lines, counts, idarr, present, i, source, ev, held)
    ctx.ts, ctx.rank, _ = lines.head(stop - 1)
    ctx.newest = newest
    return stop, held


def _stop(block: TextBlock, ev: LogEvidence) -> int:
    """The first line the quiet path cannot record (len(ids) if none)."""
    infos, hicache = block.infos, not ev.context.hicache
    bad = [k for k in block.present if not infos[k].recordable or (hicache and infos[k].hicache)]
    return min(int((block.ids == k).argmax()) for k in bad) if bad else len(block.ids)


class _Words:
    """A text's bytes, and the 8 bytes from any offset read as one big-endian integer: a
    figure is gathered per line in one step (`keys(offsets, cols)`), not a byte at a time."""

    def __init__(self, buf: bytes) -> None:
        import numpy as np

        # Not padded for a word past the end (a copy: memory a big text would fault in).
        self.bytes = np.frombuffer(buf, np.uint8)
        self.limit = len(buf) - 8  # the last offset a whole word starts at
        self.words = np.ndarray((self.limit + 1,), ">u8", buffer=buf, strides=(1,))

    def keys(self, offsets, cols: tuple[int, ...]) -> list:
        """For each line (its offset, ascending), the bytes at `cols` (columns into the line,
        ascending) as integers, one per 8 columns with the other bytes masked off: compared
        as tuples they order the lines as the bytes at `cols` do."""
        import numpy as np

        out = []
        for base, mask in _masks(cols):
            at = offsets + base
            word = self.words[np.minimum(at, self.limit)]
            if len(at) and at[-1] > self.limit:  # a word past the end: no bytes there (zeros)
                word = word << (np.maximum(at - self.limit, 0) * 8).astype(np.uint64)
            out.append(word & np.uint64(mask))
        return out


@functools.lru_cache(maxsize=4096)
def _masks(cols: tuple[int, ...]) -> list[tuple[int, int]]:
    """The words `cols` fall in (each word's first column) and the mask of their bytes."""
    return [
        (base, sum(0xFF << 8 * (7 - c + base) for c in cols if base <= c < base + 8))
        for base in range(cols[0], cols[-1] + 1, 8)
    ]


def _served(data: _Words, starts, groups: dict, infos: list[TextShape]) -> int:
    """Requests answered: the access lines whose status figure (at the column their shape
    gives) is 2 or 3, as rules.signatures.SERVED reads them."""
    import numpy as np

    served = 0
    for k, sel in groups.items():
        if infos[k].kind == SERVED:
            figure = data.bytes[starts[sel] + infos[k].status]
            served += int(np.count_nonzero((figure == 50) | (figure == 51)))
    return served


def _rank_lasts(data: _Words, starts, groups: dict, infos: list[TextShape]) -> list[int]:
    """The index of each distinct rank label's last line, in line order (the rank figures,
    gathered at the columns of each shape's tokens, tell the labels apart)."""
    import numpy as np

    out: list[int] = []
    for k, sel in groups.items():
        if cols := infos[k].ranked:
            keys = data.keys(starts[sel], cols)
            if len(keys) == 1:  # a 1-D key sorts as numbers; rows of several, row-wise
                _, first = np.unique(keys[0][::-1], return_index=True)
            else:
                _, first = np.unique(np.stack(keys, 1)[::-1], return_index=True, axis=0)
            out += sel[len(sel) - 1 - first].tolist()
    return sorted(out)


def _newest(lines: _Lines, data: _Words, groups: dict) -> str | None:
    """The latest stamp among the recorded lines: within a shape a stamp's characters stand
    at the same columns, so its bytes read as big-endian integers order as its text does;
    the latest of each shape is compared as text."""
    import numpy as np

    best: list[str] = []
    for k, sel in groups.items():
        info = lines.block.infos[k]
        if info.stamped:
            cols = tuple(range(info.stamped[0], info.stamped[-1] + 1))
            rows = np.arange(len(sel))
            for word in data.keys(lines.starts[sel], cols):  # type: ignore[index]
                column = word[rows]  # the rows holding the greatest word so far, word by word
                rows = rows[column == column.max()]
            best.append(lines.head(int(sel[rows[0]]))[0])
    return max(best) if best else None


def _progress(lines: _Lines, counts, idarr, present, i, source, ev: LogEvidence, held):
    """Count the progress lines among the recorded ones (`idarr`: their shape ids) and keep
    the last ones as ev.add_progress one at a time would (logs/blocks.py's _add_progress);
    returns what the caller holds from now."""
    import numpy as np

    block = lines.block
    found = sum(int(counts[k]) for k in present if block.progress[k])
    if not found:
        return held
    recent = ev.recent_progress
    keep = total = len(recent) + (len(held.picked) if held else 0) + found
    if total > 2 * KEEP_PROGRESS:
        keep = KEEP_PROGRESS + 1 + (total - KEEP_PROGRESS - 1) % KEEP_PROGRESS
    flags = np.array(block.progress, dtype=bool)[idarr]
    picked = np.flatnonzero(flags)[-min(keep, found) :].tolist()
    ev.progress_count += found
    ev.progress_last[source] = i + picked[-1] + 1
    pending = Pending(lines, picked, i, source)
    if found >= keep:  # these replace every line kept so far
        recent.clear()
        return pending
    if held is not None:
        recent += held.items()
    del recent[: max(0, len(recent) - (keep - found))]
    recent += pending.items()
    return None
