"""Record a Block of plain SGLang lines (triage.lines) at once: what the log reader's fast path
records of each (its rank's last line, progress, served requests, the stamp and rank it holds),
up to the first line that needs the full path, where the reader takes over.

One loop reads each line's prefix and sorts SGLang's batch lines (progress, whatever they hold)
from the rest; the tests the fast path makes per line (triggers, HiCache's name, progress
words, access lines) then run once over the text of the rest, and hits are mapped back to
their lines. tests/unit/triage/test_triage_stream.py checks it agrees with reading line by line.
"""

from __future__ import annotations

import bisect
import itertools
import operator
import re
from collections.abc import Callable

from hicache_diag.evidence.ranks import RankId
from hicache_diag.logs.lines import Block
from hicache_diag.logs.model import KEEP_PROGRESS, LogEvidence
from hicache_diag.logs.triggers import (
    BLOCK_TRIGGER,
    BLOCK_TRIGGER_WORDS,
    HICACHE_WORDS,
    PROGRESS_HINT,
    PROGRESS_WORDS,
    SCHEDULER_PROGRESS,
)
from hicache_diag.rules import signatures as sig
from hicache_diag.rules.signatures import Context

Head = tuple["str | None", "RankId | None", bool]  # stamp, rank, has PP (triage.logs._bracket)
Bracket = Callable[[str], "Head | None"]
# An access line (rules.signatures.SERVED) and the rest of its line. No match crosses a line:
# SERVED's path stops at a blank, and a block line's stamp has one before the next field.
_BATCH = SCHEDULER_PROGRESS + tuple(" " + s for s in SCHEDULER_PROGRESS)
_SERVED_LINE = re.compile(f"(?:{sig.SERVED.pattern})[^\n]*")


class _Text:
    """Some of a block's lines joined by newlines; a hit's line by counting newlines up to it
    (hits asked in order count on from the last one)."""

    def __init__(self, lines: list[str], nl: int) -> None:
        self.text = "".join(lines) if nl else "\n".join(lines)  # a newline ends each line
        self._at = self._line = 0

    def line_of(self, pos: int) -> int:
        if pos < self._at:
            self._at = self._line = 0
        self._line += self.text.count("\n", self._at, pos)
        self._at = pos
        return self._line

    def start_of(self, line: int) -> int:
        """Where line `line` starts (the text's end past the last line)."""
        pos = 0
        for _ in range(line):
            pos = self.text.find("\n", pos) + 1
            if pos == 0:
                return len(self.text)
        return pos

    def first(self, words: tuple[str, ...], end: int) -> int:
        """The first of `words` before `end` (a text position), or end."""
        for word in words:
            if (p := self.text.find(word, 0, end)) >= 0:
                end = p
        return end


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
    insides, progress, others = _scan(block.raw, start, bracket)
    text = _Text([block.raw[n] for n in others], block.nl)
    stop = _stop(block, start + len(insides), text, others, ev)
    if stop == start:
        return 0
    progress, served = _progress_and_served(block.raw, text, others, progress, stop)
    block.start = stop
    ev.recognised += stop - start
    ev.labelled += stop - start
    ev.served += served
    last = dict(zip(insides[: stop - start], range(start, stop), strict=True))  # last wins
    heads = {inside: bracket(inside) for inside in last}
    if not ev.context.pp and any(h[2] for h in heads.values()):  # type: ignore[index]
        ev.context = ev.context | Context(pp=True)
    lines = _Lines(block, start, insides, heads, ctx.ts)
    if ctx.noise_next and any((m := lines.msg(n)) and not m.isspace() for n in range(start, stop)):
        ctx.noise_next = False
    by_rank: dict[int, int] = {}
    for inside, n in last.items():
        if (rank := heads[inside][1]) is not None:  # type: ignore[index]
            by_rank[id(rank)] = max(n, by_rank.get(id(rank), n))
    for n in by_rank.values():
        rank, stamp = lines.rank_ts(n)
        last_seen[id(rank)] = (rank, stamp, i + n - start + 1, lines.msg(n))
    if progress:
        _add_progress(ev, lines, progress, i, source)
    ctx.rank, ctx.ts = lines.rank_ts(stop - 1)
    return stop - start


# Each line's `[...]` prefix inside and whether SGLang's batch line follows it, one match per
# line: the leading newline makes the engine jump from line start to line start.
_HEAD = re.compile(r"\n(?:\[([^\]\n]{0,198})\]([^\S\n]?(?:Decode|Prefill) batch)?)?")


def _scan(raw: list[str], start: int, bracket: Bracket) -> tuple[list[str], list[int], list[int]]:
    """Each line's prefix inside, up to the first line whose prefix is not one; the lines that
    are SGLang's batch lines (progress, whatever they hold) and the others. C-level passes over
    the block's text, no step per line but two list builds."""
    lines = raw[start:] if start else raw
    text = "".join(lines) if lines and lines[0][-1:] == "\n" else "\n".join(lines)
    heads = _HEAD.findall("\n" + text)
    insides = [h[0] for h in heads]
    bad = [x for x in set(insides) if bracket(x) is None]
    if bad:
        stop = min(insides.index(x) for x in bad)
        insides, heads = insides[:stop], heads[:stop]
    flags = [h[1] for h in heads]
    span = range(start, start + len(heads))
    progress = list(itertools.compress(span, flags))
    others = list(itertools.compress(span, map(operator.not_, flags)))
    return insides, progress, others


def _stop(block: Block, stop: int, text: _Text, others: list[int], ev: LogEvidence) -> int:
    """The first line the full path must read: HiCache's name while the context lacks it, or a
    trigger among the other lines (before `stop`, where the prefixes end)."""
    raw, start = block.raw, block.start
    if not ev.context.hicache and block.hicache_words is not False:
        names = _Text(raw[start:stop], block.nl)
        hit = names.first(HICACHE_WORDS, len(names.text))
        block.hicache_words = hit < len(names.text)  # False: none in the rest either
        if block.hicache_words:
            stop = start + names.line_of(hit)
    end = len(text.text)
    if (found := BLOCK_TRIGGER.search(text.text)) is not None:
        end = found.start()
    end = text.first(BLOCK_TRIGGER_WORDS, end)
    if end < len(text.text):
        stop = min(stop, others[text.line_of(end)])
    return stop


def _progress_and_served(
    raw: list[str], text: _Text, others: list[int], progress: list[int], stop: int
) -> tuple[list[int], int]:
    """The progress lines before the stop (batch lines, and other lines by their words) and
    the count of requests answered among the other lines."""
    before = bisect.bisect_left(others, stop)
    limit = len(text.text) if before == len(others) else text.start_of(before)
    worded = set()
    if text.first(PROGRESS_WORDS, limit) < limit:  # PROGRESS ignores case: slow on much text
        for hit in PROGRESS_HINT.finditer(text.text, 0, limit):
            n = others[text.line_of(hit.start())]
            if sig.PROGRESS.search(raw[n]):
                worded.add(n)
    # One match per line at most (each takes the rest of its line): the lines that served.
    served = len(_SERVED_LINE.findall(text.text, 0, limit))
    served -= sum(1 for n in worded if sig.SERVED.search(raw[n]))  # progress comes first
    if worded:
        progress = sorted(set(progress) | worded)
    return progress[: bisect.bisect_left(progress, stop)], served


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


def _add_progress(ev: LogEvidence, lines: _Lines, progress: list[int], i: int, source: str):
    start = lines.start
    ev.progress_count += len(progress)
    ev.progress_last[source] = i + progress[-1] - start + 1
    recent = ev.recent_progress
    # What add_progress's trimming (drop the oldest KEEP_PROGRESS past 2 x KEEP_PROGRESS)
    # leaves after these appends, one at a time: the last `keep` of old and new together.
    keep = total = len(recent) + len(progress)
    if total > 2 * KEEP_PROGRESS:
        keep = KEEP_PROGRESS + 1 + (total - KEEP_PROGRESS - 1) % KEEP_PROGRESS
    del recent[: max(0, len(recent) - max(0, keep - len(progress)))]
    for n in progress[-keep:]:
        rank, stamp = lines.rank_ts(n)
        recent.append((rank, stamp, source, i + n - start + 1, lines.msg(n)))
