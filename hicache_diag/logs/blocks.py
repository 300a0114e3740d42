"""Record a Block of plain SGLang lines (triage.lines) at once: what the log reader's fast path
records of each (its rank's last line, progress, served requests, the stamp and rank it holds),
up to the first line that needs the full path, where the reader takes over.

Each line is read by its shape (logs/shapes.py: figures zeroed): whether it is SGLang's batch
line, holds a trigger, HiCache's name, progress words or may be an access line is asked once
per shape; per line there are C-level passes only (the shapes, a dict look-up, the label's
inside sliced at the offset its shape gives). tests/unit/triage/test_triage_stream.py checks
it agrees with reading line by line.
"""

from __future__ import annotations

import itertools
import operator
import re
from collections.abc import Callable

from hicache_diag.evidence.ranks import RankId
from hicache_diag.logs.block import Block
from hicache_diag.logs.model import KEEP_PROGRESS, LogEvidence
from hicache_diag.logs.shapes import BAD, BATCH, BOOK, SERVED, TRIGGER, WORDED, shapes_of
from hicache_diag.rules import signatures as sig
from hicache_diag.rules.signatures import Context

Head = tuple["str | None", "RankId | None", bool]  # stamp, rank, has PP (triage.logs._bracket)
Bracket = Callable[[str], "Head | None"]
# An access line (rules.signatures.SERVED) and the rest of its line; the lines it is asked of
# are joined by _APART, which no match crosses (SERVED's path holds no blank or quote).
_SERVED_LINE = re.compile(f"(?:{sig.SERVED.pattern})[^\n]*")
_APART = '\n" \n'


def read_block(
    block: Block,
    i: int,
    source: str,
    ctx,  # triage.log_model.ReadCtx: the rank and stamp the reader holds
    ev: LogEvidence,
    last_seen: dict,
    bracket: Bracket,
) -> int:
    """Record block's lines from block.start (stream index i) up to the first that needs the
    full path (a trigger, HiCache words while the context lacks them, a prefix that is not
    one); advance block.start to it and return how many lines were recorded."""
    start = block.start
    if block.shapes is None:
        block.shapes = shapes_of(block.raw, block.nl)
    shapes = block.shapes[start:] if start else block.shapes
    kinds = BOOK.kinds(shapes)
    insides = _insides(block.raw, start, shapes, kinds, bracket)
    count = _stop(block, shapes, kinds, len(insides), ev)
    if count == 0:
        return 0
    stop = start + count
    block.start = stop
    ev.recognised += count
    ev.labelled += count
    ev.served += _served(block.raw, start, kinds, count)
    last = dict(zip(insides[:count], range(start, stop), strict=True))  # last wins
    heads = {inside: bracket(inside) for inside in last}
    stamps = [h[0] for h in heads.values() if h[0] and len(h[0]) >= 19]  # type: ignore[index]
    ctx.newest = max(stamps) if stamps else None
    if not ev.context.pp and any(h[2] for h in heads.values()):  # type: ignore[index]
        ev.context = ev.context | Context(pp=True)
    lines = _Lines(block, start, insides, heads, ctx.ts)
    if ctx.noise_next and any(map(BOOK.says_something, set(shapes[:count]))):
        ctx.noise_next = False
    by_rank: dict[int, int] = {}
    for inside, n in last.items():
        if (rank := heads[inside][1]) is not None:  # type: ignore[index]
            by_rank[id(rank)] = max(n, by_rank.get(id(rank), n))
    for n in by_rank.values():
        rank, stamp = lines.rank_ts(n)
        last_seen[id(rank)] = (rank, stamp, i + n - start + 1, lines.msg(n))
    _add_progress(ev, lines, kinds, count, i, source)
    ctx.rank, ctx.ts = lines.rank_ts(stop - 1)
    return count


def _first(kinds: list[int], kind: int, end: int) -> int:
    """The first index of `kind` before `end`, else end (one C-level scan)."""
    try:
        return kinds.index(kind, 0, end)
    except ValueError:
        return end


def _insides(raw: list[str], start: int, shapes: list[str], kinds: list[int], bracket) -> list:
    """Each line's label inside, up to the first line whose shape has no label or whose label
    is no prefix (bracket says None): sliced at the offsets the shapes give."""
    end = _first(kinds, BAD, len(kinds))
    cuts = map(BOOK.inside.__getitem__, itertools.islice(shapes, end))
    insides = list(map(str.__getitem__, itertools.islice(raw, start, None), cuts))
    bad = [x for x in set(insides) if bracket(x) is None]
    if bad:
        del insides[min(insides.index(x) for x in bad) :]
    return insides


def _stop(block: Block, shapes: list[str], kinds: list[int], end: int, ev: LogEvidence) -> int:
    """How many lines the block path records: up to `end` (where the labels end), HiCache's
    name while the context lacks it, or a trigger in a line that is no batch line."""
    if not ev.context.hicache and block.hicache_words is not False:
        named = [s for s in set(shapes[:end]) if BOOK.hicache(s)]
        block.hicache_words = bool(named)  # False: none in the rest either
        if named:
            end = min(shapes.index(s, 0, end) for s in named)
    return _first(kinds, TRIGGER, end)


def _served(raw: list[str], start: int, kinds: list[int], count: int) -> int:
    """Requests answered among the first `count` lines: the raw lines whose shape may be an
    access line, read by SERVED (the status figure is the raw line's)."""
    kinds = kinds[:count]
    if SERVED not in kinds:
        return 0
    maybe = itertools.compress(
        itertools.islice(raw, start, None), map(operator.eq, kinds, itertools.repeat(SERVED))
    )
    return len(_SERVED_LINE.findall(_APART.join(maybe)))


class _Lines:
    """The recorded lines' messages, ranks and stamps."""

    def __init__(self, block: Block, start: int, insides: list[str], heads: dict, ts) -> None:
        self.block, self.start, self.insides, self.heads, self.ts = block, start, insides, heads, ts

    def msg(self, n: int) -> str:
        line = self.block.line(n)
        text = line[line.find("]", 1, 200) + 1 :]
        return text[1:] if text[:1].isspace() else text

    def rank_ts(self, n: int) -> tuple[RankId | None, str | None]:
        """The rank of line n and the stamp the reader held there (the latest one given)."""
        rank = self.heads[self.insides[n - self.start]][1]
        for back in range(n, self.start - 1, -1):
            if stamp := self.heads[self.insides[back - self.start]][0]:
                return rank, stamp
        return rank, self.ts


def _add_progress(ev: LogEvidence, lines: _Lines, kinds: list[int], count: int, i: int, source):
    """The progress lines among the first `count` (batch lines and worded ones): counted, the
    last one noted, the last KEEP_PROGRESS or so kept as add_progress one at a time would."""
    kinds = kinds[:count]
    found = kinds.count(BATCH) + kinds.count(WORDED)
    if not found:
        return
    start = lines.start
    progress = []  # the last `keep` progress lines, newest first
    keep = total = len(ev.recent_progress) + found
    if total > 2 * KEEP_PROGRESS:
        keep = KEEP_PROGRESS + 1 + (total - KEEP_PROGRESS - 1) % KEEP_PROGRESS
    for n in range(count - 1, -1, -1):
        if len(progress) >= min(keep, found):
            break
        if kinds[n] == BATCH or kinds[n] == WORDED:
            progress.append(start + n)
    progress.reverse()
    ev.progress_count += found
    ev.progress_last[source] = i + progress[-1] - start + 1
    recent = ev.recent_progress
    # What add_progress's trimming (drop the oldest KEEP_PROGRESS past 2 x KEEP_PROGRESS)
    # leaves after these appends, one at a time: the last `keep` of old and new together.
    del recent[: max(0, len(recent) - max(0, keep - found))]
    for n in progress:
        rank, stamp = lines.rank_ts(n)
        recent.append((rank, stamp, source, i + n - start + 1, lines.msg(n)))
