"""A run of plain SGLang lines (`Block`) and what makes a line plain: normalise (logs/lines.py)
leaves it as it is, so the log reader records it without per-line handlers."""

from __future__ import annotations

import re

from hicache_diag.logs.carriers import TRACEBACK

# An SGLang prefix glued onto the end of the previous line (two writers on one stream).
_GLUED = re.compile(
    r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?(?: [A-Z]{1,8}(?:_[A-Z]{1,8})?\d{1,5}){0,8}\] "
)


class Block:
    """A run of plain SGLang log lines that normalising leaves as they are but for their
    newline (each starts with SGLang's own `[20..-..-.. ` prefix; no carrier, colour, CR, glued
    prefix or traceback): the log reader records them without per-line handlers. `raw` holds
    them as read (each with its newline when `nl` is 1); `start` is the first not yet read."""

    __slots__ = ("raw", "nl", "start", "hicache_words", "shapes")

    def __init__(self, raw: list[str], nl: int) -> None:
        self.raw = raw
        self.nl = nl
        self.start = 0
        self.hicache_words: bool | None = None  # a line may name HiCache (the reader's test)
        self.shapes: list[str] | None = None  # raw's shapes (logs/shapes.py), when asked

    def line(self, k: int) -> str:
        return self.raw[k][: len(self.raw[k]) - self.nl]

    def rest(self) -> list[str]:
        """The lines from `start` on, newlines off (a handler that looks ahead into them)."""
        raw = self.raw[self.start :]
        return [s[:-1] for s in raw] if self.nl else raw


_PLAIN: dict[str, bool] = {}
_ISO_SHAPE = re.compile(r"\[00\d\d-\d\d-\d\dT")  # `[2026-06-24T` as a shape (`[20` tested apart)


def plain_shape(shape: str) -> bool:
    """A line of this shape that starts with `[20` is left as it is by normalise: no CR,
    colour, traceback, ISO stamp (a carrier's) or SGLang prefix glued after a non-blank."""
    if (plain := _PLAIN.get(shape)) is None:
        if len(_PLAIN) > 65536:
            _PLAIN.clear()
        plain = _PLAIN[shape] = not (
            "\r" in shape
            or "\x1b" in shape
            or TRACEBACK in shape
            or _ISO_SHAPE.match(shape)
            or (shape.find("[", 1) > 0 and glue_points(shape))
        )
    return plain


def glue_points(line: str) -> list[int]:
    """Where an SGLang prefix starts in the middle of a line, right after a non-blank."""
    return [m.start() for m in _GLUED.finditer(line, 1) if not line[m.start() - 1].isspace()]
