"""Line shapes: a line with its figures zeroed (`[2026-06-24 15:38:07 PP1 TP0] Decode batch,
#token: 91234` -> `[0000-00-00 00:00:00 PP0 TP0] Decode batch, #token: 00000`). A busy server's
log is a handful of shapes repeated a million times, so what the block reader asks of a line
(logs/blocks.py: is it a batch line, does it hold a trigger, HiCache's name, progress words, an
access line) is asked once per shape, and per line there is one dict look-up, all at C level.

A shape keeps every character but the figures 1-9, at the same offsets: a test is asked of the
shape in place of the line only where the answer cannot depend on which figure it is (the words
and regexes below hold no figure but `0`, tests/unit/triage/test_shapes.py checks it; `0` in a
word makes the shape's answer a superset of the line's, the safe side for a trigger). The one
figure-dependent test, an access line's status (`[23]\\d\\d`), is asked of the raw lines whose
shape could be one.
"""

from __future__ import annotations

import re

from hicache_diag.logs.triggers import (
    BLOCK_TRIGGER,
    BLOCK_TRIGGER_WORDS,
    PROGRESS_HINT,
    has_hicache_word,
)
from hicache_diag.rules import signatures as sig

ZERO = str.maketrans("123456789", "000000000")
ZERO_BYTES = bytes.maketrans(b"123456789", b"000000000")  # the same for bytes (logs/textblock.py)

# What the block reader does with a line of a shape (logs/blocks.py).
BAD = 0  # no `[...]` head where SGLang's label stands: the block ends before it
BATCH = 1  # SGLang's batch line: progress, whatever it holds
TRIGGER = 2  # a word the full path must read
WORDED = 3  # progress by its words (rules.signatures.PROGRESS)
SERVED = 4  # may be an access line (its status is read from the raw line)
PLAIN = 5  # nothing to record but the line itself

# SGLang's batch line right after the label (one blank or none before it).
_BATCH = re.compile(r"[^\S\n]?(?:Decode|Prefill) batch")
# rules.signatures.SERVED with the status's first figure free: what its shape may match.
SERVED_SHAPE = re.compile(sig.SERVED.pattern.replace("[23]", r"\d"))
_MAX_SHAPES = 65536  # a log whose every line has its own shape: the book starts afresh


def shapes_of(lines: list[str], nl: int) -> list[str]:
    """The shape of each line (each ends with its newline when `nl` is 1): two C-level passes
    over the lines' text, no step per line."""
    text = "".join(lines) if nl else "\n".join(lines)
    out = text.translate(ZERO).split("\n")
    if nl:
        out.pop()  # after the last line's newline
    return out


def kind_of(shape: str) -> tuple[int, slice]:
    """(what the reader does with the shape's lines, where their label's inside stands)."""
    j = shape.find("]", 1, 200) if shape[:1] == "[" else -1
    if j < 0:
        return BAD, slice(0, 0)
    if _BATCH.match(shape, j + 1):
        return BATCH, slice(1, j)
    if BLOCK_TRIGGER.search(shape) or any(w in shape for w in BLOCK_TRIGGER_WORDS):
        return TRIGGER, slice(1, j)
    if PROGRESS_HINT.search(shape) and sig.PROGRESS.search(shape):
        return WORDED, slice(1, j)
    if " HTTP/" in shape and SERVED_SHAPE.search(shape):
        return SERVED, slice(1, j)
    return PLAIN, slice(1, j)


class ShapeBook:
    """Each shape's kind and label slice, learned on first sight; `kinds` maps a block's
    shapes at C level."""

    __slots__ = ("kind", "inside", "_hicache", "_blank")

    def __init__(self) -> None:
        self.kind: dict[str, int] = {}
        self.inside: dict[str, slice] = {}
        self._hicache: dict[str, bool] = {}
        self._blank: dict[str, bool] = {}

    def kinds(self, shapes: list[str]) -> list[int]:
        kind = self.kind
        try:
            return list(map(kind.__getitem__, shapes))
        except KeyError:
            pass
        if len(kind) > _MAX_SHAPES:
            self.__init__()  # type: ignore[misc]
            kind = self.kind
        for shape in set(shapes).difference(kind):
            kind[shape], self.inside[shape] = kind_of(shape)
        return list(map(kind.__getitem__, shapes))

    def hicache(self, shape: str) -> bool:
        """The shape's line may name HiCache (triggers.HICACHE_WORDS, no figure in them)."""
        if (hit := self._hicache.get(shape)) is None:
            hit = self._hicache[shape] = has_hicache_word(shape)
        return hit

    def says_something(self, shape: str) -> bool:
        """The message after the label is not blank."""
        if (said := self._blank.get(shape)) is None:
            j = shape.find("]", 1, 200)
            msg = shape[j + 1 :]
            msg = msg[1:] if msg[:1].isspace() else msg
            said = self._blank[shape] = bool(msg) and not msg.isspace()
        return said


BOOK = ShapeBook()
