"""Undo what carriers do to log lines before we read them: collector prefixes, partial lines,
ANSI colours, CRLF, editor line numbers, terminal wrap, prefixes glued onto the previous line,
tracebacks flattened onto one line.

Real SGLang logs reach an engineer through Kubernetes (CRI `<ts> stdout F `), `kubectl logs
--timestamps`, docker compose (`sglang-1  | `), journald, Loki / Grafana exports (an epoch or
time column, `{labels}`), dashboard table pastes (`| time | line |`), Ray, torchrun or mpirun
prefixes, editors that copy their line numbers, terminals that wrap at their width, and issue
threads where a traceback was pasted as one line. `normalise` is a generator: it holds at most
one wrapped line and one numbered line back, so a log of any length streams through it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

from hicache_diag.logs.block import Block, glue_points, plain_shape
from hicache_diag.logs.carriers import ANY_CARRIER, TRACEBACK, peel
from hicache_diag.logs.chunks import MAX_LINE, Blank
from hicache_diag.logs.framing import Framing
from hicache_diag.logs.framing_notes import FramingNotes
from hicache_diag.logs.glue import flattened, split_records, unflatten
from hicache_diag.logs.interleave import separate
from hicache_diag.logs.paste import clean_line, paste_damage
from hicache_diag.logs.shapes import ZERO
from hicache_diag.logs.shippers import unship
from hicache_diag.logs.textblock import TextBlock, TextBook, prefixed_lines, text_block
from hicache_diag.logs.texts import Text

_TRACEBACK = TRACEBACK
# A line longer than this (a tensor's repr, a base64 blob, a batch of requests) is read by its
# head and tail: what a line means is in its prefix, its first words and its end, and every
# stage after this one then works on a bounded line, however long the input.
_KEEP_END = MAX_LINE // 2


def _bounded(line: str) -> str:
    if len(line) <= MAX_LINE:
        return line
    return f"{line[:_KEEP_END]} ... {line[-_KEEP_END:]}"


BLOCK_LINES = 2048  # lines per block: long enough to pay for its tests, short for the window
_NL = itertools.repeat("\n")


def _plain_block(chunk: list[str]) -> Block | None:
    """The chunk as a Block when normalise would leave every line as it is (less its newline),
    else None. Lines come from a file (each ends with one newline) or a list (none has one).
    Only C-level passes over the chunk here (this runs on every line of a big log): its
    lines' shapes (logs/shapes.py), which the reader reads the Block by, and what makes a line
    not plain asked once per shape."""
    if chunk[0][-1:] == "\n":  # lines that keep their newline (a file iterated)
        nl, text = 1, "".join(chunk)
        if not all(map(str.endswith, chunk, _NL)):
            return None
    else:
        nl, text = 0, "\n".join(chunk)
    shapes = text.translate(ZERO).split("\n")
    if len(shapes) != len(chunk) + nl:  # a line holds a newline of its own
        return None
    if nl:
        shapes.pop()  # after the last line's newline
    distinct = set(shapes)
    if (
        # SGLang's `[2026-06-24 ...` starts every line (so no carrier can but the bracketed
        # ISO stamp: normalise's carrier scan would change nothing)
        text[:3] != "[20"
        or text.count("\n[20") != len(chunk) - 1
        or chunk[0][11:12] == "T"
        or max(map(len, distinct)) + nl > MAX_LINE
        or not all(map(plain_shape, distinct))
    ):
        return None
    block = Block(chunk, nl)
    block.shapes = shapes
    return block


def normalise(raw: Iterable[str]) -> Iterator[str]:
    """Every carrier undone, wrapped / partial lines joined, glued and flattened lines split."""
    for item in normalise_blocks(raw):
        if type(item) is TextBlock:
            yield from item.block().rest()
        elif type(item) is Block:
            yield from item.rest()
        elif type(item) is Blank:
            yield from itertools.repeat("", item.n)
        else:
            yield item


MIN_RUN = 8  # plain lines in a row that make a Block inside a mixed chunk


def _plain_line(line: str) -> int:
    """What _plain_block tests of a whole chunk, for one line: -1 when normalise would change
    it beyond its newline, else 1 when it ends with its newline, 0 when it has none."""
    if (
        line[:3] != "[20"
        or line[11:12] != " "
        or "\r" in line
        or "\x1b" in line
        or len(line) > MAX_LINE
        or _TRACEBACK in line
        or (line.find("[", 1) > 0 and glue_points(line))
    ):
        return -1
    newlines = line.count("\n")
    return newlines if newlines == 0 or (newlines == 1 and line[-1] == "\n") else -1


def _runs(chunk: list[str]) -> Iterator[tuple[int, list[str]]]:
    """The chunk cut into runs of lines of one _plain_line kind."""
    kinds = list(map(_plain_line, chunk))
    start = 0
    for k in range(1, len(chunk) + 1):
        if k == len(chunk) or kinds[k] != kinds[start]:
            yield kinds[start], chunk[start:k]
            start = k


def normalise_blocks(
    raw: Iterable[str | Blank | Text], notes: FramingNotes | None = None
) -> Iterator[str | Block | Blank | TextBlock]:
    """normalise's lines, with runs of plain SGLang lines handed on as Blocks (the hot path of
    a big log: a busy server's batch lines; a Text of them as a TextBlock) and runs of blank
    lines as Blanks; every other line goes through each stage."""
    state = _Stages(notes)
    notes = state.framing.notes
    lines, cleaned = paste_damage(unship(iter(raw), notes), state.framing)
    for items in _batches(lines):
        for chunk in _parts(separate(items, lines, notes)):
            if type(chunk) is Blank:
                yield from state.end()
                yield chunk
            elif type(chunk) is Text:
                yield from state.text(chunk, cleaned)
            else:
                yield from _chunk(chunk, cleaned, state)
    yield from state.end()


def _batches(lines: Iterator[str | Blank | Text]) -> Iterator[list]:
    """The stream BLOCK_LINES items at a time, a batch ending at a Text (which ends it: a
    batch never holds more than one read's worth of text)."""
    batch: list = []
    for item in lines:
        batch.append(item)
        if type(item) is Text or len(batch) >= BLOCK_LINES:
            yield batch
            batch = []
    if batch:
        yield batch


def _parts(items: list) -> list:
    """The items as runs of lines, with each Blank and Text on its own (most batches have
    neither)."""
    kinds = set(map(type, items))
    if Blank not in kinds and Text not in kinds:
        return [items]
    parts: list = []
    for x in items:
        if type(x) is Blank or type(x) is Text:
            parts.append(x)
        elif parts and type(parts[-1]) is list:
            parts[-1].append(x)
        else:
            parts.append([x])
    return parts


def _chunk(chunk: list[str], cleaned: bool, state: _Stages) -> Iterator[str | Block]:
    """One chunk of lines through the stages (a plain run as a Block)."""
    chunk = state.framing.strip_chunk(chunk)
    if cleaned:
        for line in chunk:
            yield from state.line(line, cleaned=True)
    elif not state.partial and (block := _plain_block(chunk)) is not None:
        yield block
    else:
        for kind, run in _runs(chunk):
            if kind >= 0 and len(run) >= MIN_RUN and not state.partial:
                yield Block(run, kind)
                continue
            for line in run:
                yield from state.line(line)


class _Stages:
    """normalise's stages for one line at a time, holding a CRI partial line until its end."""

    __slots__ = ("partial", "framing", "book")

    def __init__(self, notes: FramingNotes | None = None) -> None:
        self.partial = ""
        self.framing = Framing(notes)  # wrappers no carrier names, learned from this stream
        self.book: TextBook | None = None  # the shapes of this stream's Texts

    def text(self, text: Text, cleaned: bool) -> Iterator[str | Block | TextBlock]:
        """A Text as one TextBlock when normalise would leave its every line as it is (but
        for the learned prefix), else its lines through the stages."""
        framing = self.framing
        if not cleaned and not self.partial and (framing.learned is None or framing.bulk):
            if self.book is None:
                self.book = TextBook(framing.learned.pattern if framing.learned else None)
            if (block := text_block(text, self.book, framing.bulk)) is not None:
                framing.notes.stripped += prefixed_lines(block)
                yield block
                return
        yield from _chunk(text.lines(), cleaned, self)

    def line(self, line: str, cleaned: bool = False) -> Iterator[str]:
        if len(line) > MAX_LINE:
            line = _bounded(line)
        if cleaned:
            pass
        elif "\r" in line or "\x1b" in line:
            line = clean_line(line)
        elif line[-1:] == "\n":
            line = line[:-1]  # the usual line: its newline off without a call
        pieces = split_records(line)
        if len(pieces) > 1:
            self.framing.notes.glued += len(pieces) - 1
        for piece in pieces:
            yield from self._record(piece)

    def _record(self, line: str) -> Iterator[str]:
        """One record: its carriers and wrappers off, a flattened traceback split."""
        # `[2026-06-24 15:38:03 ...` is SGLang's prefix, never a carrier: skip the carrier scan.
        if not (line[:3] == "[20" and line[11:12] == " ") and ANY_CARRIER.match(line):
            text, continued = peel(line)
            self.framing.notes.peeled += text is not line
            if continued:
                partial = self.partial
                self.partial = (
                    _bounded(partial + text) if len(partial) > MAX_LINE else partial + text
                )
                return
            line = text
        if self.partial:
            # The joined CRI line may still carry an inner carrier (docker inside CRI).
            line, self.partial = peel(_bounded(self.partial + line))[0], ""
        if not (line[:3] == "[20" and line[11:12] == " "):
            line = self.framing.unwrap(line)
        yield from _split_glued(line, self.framing.notes)

    def end(self) -> Iterator[str]:
        if self.partial:
            partial, self.partial = self.partial, ""
            yield from _split_glued(peel(partial)[0], self.framing.notes)


def _split_glued(line: str, notes: FramingNotes) -> Iterator[str]:
    """Records glued after the carriers came off (a carrier's line holding two records), and
    a flattened traceback split into its lines."""
    pieces = split_records(line) if line.find("[", 1) > 0 else [line]
    notes.glued += len(pieces) - 1
    for piece in pieces:
        if flattened(piece):
            yield from unflatten(piece)
        else:
            yield piece
