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

    def info(self, n: int) -> TextShape:
        return self.block.infos[self.block.ids[n]]

    def text(self, n: int) -> str:
        return self.block.text[self.starts[n] : self.ends[n]]  # type: ignore[index]

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

    infos, ids, present = block.infos, block.ids, block.present
    stop = _stop(block, present, ev)
    if stop == 0:
        return 0, held
    data = np.frombuffer(block.text.encode("ascii"), np.uint8)
    idarr = np.array(ids, dtype=np.int32)
    # A line is as long as its shape: the offsets come from the ids, no search for newlines.
    ends = np.cumsum(np.array(block.lengths, dtype=np.int64)[idarr]) - 1
    starts = ends - np.array(block.lengths, dtype=np.int64)[idarr] + 1
    lines = _Lines(block, starts, ends, bracket)
    if stop < len(ids):
        present, idarr = set(ids[:stop]), idarr[:stop]
    newest = _newest(lines, data, idarr, present)
    if gap_s(latest, newest) > INCIDENT_GAP_S:
        return 0, held
    recorded = [infos[k] for k in present]
    ev.recognised += stop
    ev.labelled += stop
    if not ev.context.pp and any(info.pp for info in recorded):
        ev.context = ev.context | Context(pp=True)
    if ctx.noise_next and any(info.says for info in recorded):
        ctx.noise_next = False
    ev.served += _served(data, starts, idarr, present, infos)
    for n in _rank_lasts(data, starts, idarr, present, infos):
        stamp, rank, msg = lines.head(n)
        if rank is not None:  # in line order: a rank's later line (another shape's) wins
            last_seen[id(rank)] = (rank, stamp, i + n + 1, msg)
    held = _progress(lines, np.bincount(idarr), present, stop, i, source, ev, held)
    ctx.ts, ctx.rank, _ = lines.head(stop - 1)
    ctx.newest = newest
    return stop, held


def _stop(block: TextBlock, present: set[int], ev: LogEvidence) -> int:
    """The first line the quiet path cannot record (len(ids) if none)."""
    infos = block.infos
    hicache = not ev.context.hicache
    bad = [k for k in present if not infos[k].recordable or (hicache and infos[k].hicache)]
    return min(map(block.ids.index, bad)) if bad else len(block.ids)


def _served(data, starts, idarr, present: set[int], infos: list[TextShape]) -> int:
    """Requests answered: the access lines whose status figure (at the column their shape
    gives) is 2 or 3, as rules.signatures.SERVED reads them."""
    import numpy as np

    served = 0
    for k in present:
        info = infos[k]
        if info.kind == SERVED:
            figure = data[starts[np.flatnonzero(idarr == k)] + info.status]
            served += int(np.count_nonzero((figure == 50) | (figure == 51)))
    return served


def _rank_lasts(data, starts, idarr, present: set[int], infos: list[TextShape]) -> list[int]:
    """The index of each distinct rank label's last line, in line order: the rank figures
    gathered at the columns of each shape's tokens make a key per line (with its shape), and
    the last line of each key is kept."""
    import numpy as np

    sels, keys = [], []
    for k in present:
        cols = infos[k].ranked
        if cols:
            sel = np.flatnonzero(idarr == k)
            figures = data[starts[sel][:, None] + np.array(cols)].astype(np.int64) - 48
            sels.append(sel)
            keys.append(figures @ (10 ** np.arange(len(cols), dtype=np.int64)) * 65536 + k)
    if not sels:
        return []
    sel, key = np.concatenate(sels), np.concatenate(keys)
    _, first = np.unique(key[::-1], return_index=True)
    return sorted(sel[len(sel) - 1 - first].tolist())


def _newest(lines: _Lines, data, idarr, present: set[int]) -> str | None:
    """The latest stamp among the recorded lines: within a shape the stamp's figures, read as
    one number, order as its text does; the latest of each shape is compared as text."""
    import numpy as np

    best: list[str] = []
    for k in present:
        info = lines.block.infos[k]
        if info.stamped:
            sel = np.flatnonzero(idarr == k)
            figures = data[lines.starts[sel][:, None] + np.array(info.stamped)]  # type: ignore[index]
            keys = (figures.astype(np.int64) - 48) @ (10 ** np.arange(len(info.stamped))[::-1])
            n = int(sel[int(np.argmax(keys))])
            best.append(lines.head(n)[0])
    return max(best) if best else None


def _progress(lines: _Lines, counts, present, stop, i, source, ev: LogEvidence, held):
    """Count the progress lines among the first `stop` and keep the last ones as
    ev.add_progress one at a time would (logs/blocks.py's _add_progress); returns what the
    caller holds from now."""
    block = lines.block
    found = sum(int(counts[k]) for k in present if block.progress[k])
    if not found:
        return held
    recent = ev.recent_progress
    keep = total = len(recent) + (len(held.picked) if held else 0) + found
    if total > 2 * KEEP_PROGRESS:
        keep = KEEP_PROGRESS + 1 + (total - KEEP_PROGRESS - 1) % KEEP_PROGRESS
    flags, ids, want, picked = block.progress, block.ids, min(keep, found), []
    for n in range(stop - 1, -1, -1):
        if flags[ids[n]]:
            picked.append(n)
            if len(picked) >= want:
                break
    picked.reverse()
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
