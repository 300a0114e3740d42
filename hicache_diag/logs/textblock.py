"""A Text (logs/texts.py: a read's worth of whole ASCII lines) read by its line shapes, with no
string made per line but its shape: what normalise would do to each line (nothing, or take
the prefix the stream's first lines taught off) and what the log reader needs of it (its kind,
where its label, rank figures, stamp and access status stand) are learned once per shape, and a
line is one integer, its shape's id. The reader records such a block at C speed
(logs/quiet.py); a block it cannot (a trigger, a stamp past an incident's gap) becomes the
`Block` normalise would have made of the same lines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hicache_diag.logs.block import Block, plain_shape
from hicache_diag.logs.chunks import MAX_LINE
from hicache_diag.logs.shapes import (
    BAD,
    BATCH,
    SERVED,
    SERVED_SHAPE,
    TRIGGER,
    WORDED,
    ZERO_BYTES,
    kind_of,
    shapes_of,
)
from hicache_diag.logs.texts import Text
from hicache_diag.logs.triggers import has_hicache_word
from hicache_diag.rules.rank_labels import split_prefix

_DATED = re.compile(r"\[0000-00-00 ")  # a label's full date as a shape (no ISO `T`: a carrier's)
_MAX_SHAPES = 65536  # a stream whose every line has its own shape: the book starts afresh


@dataclass(frozen=True, slots=True)
class TextShape:
    """What a line of one shape is, at offsets into the line as read (prefix included)."""

    prefix: int  # the learned prefix's length (0: the line has none)
    plain: bool  # normalise leaves the line as it is but for the prefix
    kind: int  # logs/shapes.py's kind of the line after the prefix
    inside: slice  # its label's inside
    recordable: bool  # the quiet reader can record it (no trigger, a full stamp, ...)
    pp: bool  # its label names a PP rank
    ranked: tuple[int, ...]  # the columns of its rank tokens' figures
    stamped: tuple[int, ...]  # the columns of its stamp's figures (its label starts with it)
    status: int  # the column of an access line's status figure (-1: none)
    hicache: bool  # it may name HiCache (the reader asks while it has not seen HiCache)
    says: bool  # its message is not blank

    @property
    def progress(self) -> bool:
        return self.kind == BATCH or self.kind == WORDED


def learn_shape(shape: str, prefix: re.Pattern[str] | None) -> TextShape:
    """A shape's TextShape, `prefix` being the stream's learned prefix (or None)."""
    m = prefix.match(shape) if prefix is not None else None
    p = m.end() if m else 0
    rest = shape[p:]
    plain = bool(_DATED.match(rest)) and len(rest) <= MAX_LINE and plain_shape(rest)
    kind, inside = kind_of(rest)
    head = split_prefix(rest[: inside.stop + 1]) if kind != BAD else None
    stamp, tokens = (head[0], head[1]) if head else (None, None)
    ranked: tuple[int, ...] = ()
    if tokens:
        at = p + inside.start + len(rest[inside].rstrip()) - len(tokens)
        ranked = tuple(at + k for k, c in enumerate(tokens) if c == "0")
    stamped = tuple(p + inside.start + k for k, c in enumerate(stamp or "") if c == "0")
    status = -1
    if kind == SERVED and len(hits := list(SERVED_SHAPE.finditer(rest))) == 1:
        status = p + hits[0].end() - 3  # the first figure of `[23]\d\d`
    msg = rest[inside.stop + 1 :] if kind != BAD else ""
    msg = msg[1:] if msg[:1].isspace() else msg
    return TextShape(
        prefix=p,
        plain=plain,
        kind=kind,
        inside=slice(p + inside.start, p + inside.stop),
        recordable=plain
        and kind not in (BAD, TRIGGER)
        and stamp is not None
        and len(stamp) >= 19
        and (kind != SERVED or status >= 0),
        pp=bool(tokens and "PP" in tokens),
        ranked=ranked,
        stamped=stamped,
        status=status,
        hicache=has_hicache_word(rest),
        says=bool(msg) and not msg.isspace(),
    )


class TextBook:
    """One stream's shapes, each learned on first sight: `ids` maps a shape to its index in
    `infos`."""

    __slots__ = ("ids", "infos", "prefix", "progress", "lengths")

    def __init__(self, prefix: re.Pattern[str] | None) -> None:
        self.prefix = prefix
        self.ids: dict[bytes, int] = {}
        self.infos: list[TextShape] = []
        self.progress: list[bool] = []  # each shape's `progress`, indexed by id
        self.lengths: list[int] = []  # each shape's length (its lines', newline included)

    def ids_of(self, shapes: list[bytes]):
        """Each shape's id (shapes are bytes: ASCII, as read), as a numpy array; a new shape
        is learned on first sight."""
        import numpy as np  # here: a log too small to make a Text never pays for the import

        ids = self.ids
        try:
            return np.fromiter(map(ids.__getitem__, shapes), np.int32, len(shapes))
        except KeyError:
            pass
        if len(ids) > _MAX_SHAPES:
            ids.clear()
            self.infos, self.progress, self.lengths = [], [], []
        for shape in set(shapes).difference(ids):
            ids[shape] = len(self.infos)
            self.infos.append(info := learn_shape(shape.decode("ascii"), self.prefix))
            self.progress.append(info.progress)
            self.lengths.append(len(shape) + 1)
        return np.fromiter(map(ids.__getitem__, shapes), np.int32, len(shapes))


class TextBlock:
    """A Text whose every line normalise leaves as it is (but for the learned prefix): its
    bytes, each line's shape id and the shapes the ids index. `block()` is the
    Block normalise would have made of it (the prefix off every line that has it)."""

    __slots__ = ("data", "ids", "counts", "present", "infos", "progress", "lengths", "bulk")

    def __init__(self, data: bytes, ids, book: TextBook, bulk: re.Pattern[str] | None) -> None:
        import numpy as np

        self.data, self.ids, self.bulk = data, ids, bulk  # ids: a numpy array, one per line
        self.counts = np.bincount(ids)  # lines of each shape id
        self.present: list[int] = np.flatnonzero(self.counts).tolist()  # the ids it holds
        # The book's lists as they are now (a book that starts afresh makes new ones).
        self.infos, self.progress, self.lengths = book.infos, book.progress, book.lengths

    def block(self) -> Block:
        text = self.data[:-1].decode("ascii")
        if self.bulk is not None:
            text = self.bulk.sub("\n", "\n" + text)[1:]
        lines = text.split("\n")
        block = Block(lines, 0)
        block.shapes = shapes_of(lines, 0)
        return block


def text_block(text: Text, book: TextBook, bulk: re.Pattern[str] | None) -> TextBlock | None:
    """The Text as a TextBlock when normalise leaves every line as it is (but for the learned
    prefix), else None (its lines go through every stage)."""
    data = text.data
    shapes = data.translate(ZERO_BYTES).split(b"\n")
    shapes.pop()  # after the last line's newline
    block = TextBlock(data, book.ids_of(shapes), book, bulk)
    return block if all(block.infos[k].plain for k in block.present) else None


def prefixed_lines(block: TextBlock) -> int:
    """How many of the block's lines lose the learned prefix (the report's share)."""
    return sum(int(block.counts[k]) for k in block.present if block.infos[k].prefix)
