"""A UTF-8 log read as bytes, a megabyte at a time: a read of whole plain lines (ASCII, no
blank run, no NUL, no over-long line) past the stream's first HEAD_ITEMS items goes on as one
`Text`, never decoded or split (logs/textblock.py reads it by its line shapes); any other read
is decoded and split into lines as logs/chunks.py does. A line longer than MAX_LINE hands the
rest of the stream over to logs/chunks.py, which keeps such a line by its head and tail in
characters, as it always has."""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Iterable, Iterator

from hicache_diag.logs.chunks import (
    BLANK_RUN,
    CHUNK,
    MAX_LINE,
    Blank,
    Decoded,
    bounded,
    read_chunks,
    reads,
    split_lines,
)
from hicache_diag.logs.framing_notes import FramingNotes

# Items read as lines before any Text: the stages that learn a stream from its first lines
# probe fewer (logs/shippers.py 100, then logs/paste.py 2000: tests/unit/triage/test_quiet.py).
HEAD_ITEMS = 2112
TEXT_SIZE = 1024 * 1024  # bytes a Text's read asks for: its per-Text costs paid once a megabyte
_RUN = b"\n" * BLANK_RUN


class Text:
    """A read's worth of whole lines, each ended by its newline, as bytes (all ASCII: a
    line's characters are its bytes). `lines()` is what it holds as lines."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def lines(self) -> list[str]:
        return self.data[:-1].decode("ascii").split("\n")

    def __repr__(self) -> str:
        return f"Text({self.data.count(10)} lines)"


def expand(items: Iterable[str | Blank | Text]) -> Iterator[str | Blank]:
    """The items with each Text as its lines (a stage that reads every line on its own)."""
    for item in items:
        if type(item) is Text:
            yield from item.lines()
        else:
            yield item  # type: ignore[misc]


def read_items(
    source: Decoded, cut: list[int], notes: FramingNotes
) -> Iterator[str | Blank | Text]:
    """The stream's lines, Blanks and Texts, one at a time (logs/chunks.py's read_lines with
    Texts)."""
    for items in _read(source, cut, notes):
        yield from items


def _read(source: Decoded, cut: list[int], notes: FramingNotes) -> Iterator[list]:
    carry = b""
    given = 0  # items handed on as lines so far
    size = [CHUNK]  # the next read's size: a Text's reads ask for more
    for data in reads(lambda: source.raw(size[0]), cut):
        end = data.rfind(b"\n") + 1
        if end == 0 and len(carry) + len(data) <= MAX_LINE:
            carry += data
            continue
        if end == 0 or len(data) - end > MAX_LINE:  # a line longer than any a Text holds:
            if end:  # the rest is read as characters, as logs/chunks.py reads it
                yield split_lines(_text(source, b"".join((carry, memoryview(data)[:end])), notes))
            # The long line so far (a character it ends inside waits in the decoder).
            tail = _text(source, data[end:] if end else carry + data, notes)
            yield from read_chunks(source, cut, notes=notes, carry=bounded(tail))
            return
        first = b"".join((carry, memoryview(data)[:end]))  # one copy, not a slice and a sum
        carry = data[end:]
        if given < HEAD_ITEMS:  # the head's lines, then (the same read) maybe a Text
            head = _after_lines(first, HEAD_ITEMS - given)
            items = split_lines(_text(source, first[:head], notes))
            given += len(items)
            yield items
            first = first[head:]
            if not first:
                continue
        if given >= HEAD_ITEMS and _whole(first):
            if size[0] != TEXT_SIZE:
                size[0] = TEXT_SIZE
                keep_freed_memory()
            yield [Text(first)]
            continue
        size[0] = CHUNK
        items = split_lines(_text(source, first, notes))
        given += len(items)
        yield items
    if carry:
        yield [bounded(_text(source, carry, notes, final=True))]


def _text(source: Decoded, data: bytes, notes: FramingNotes, final: bool = False) -> str:
    """Bytes decoded, NUL characters dropped (a hole of NUL bytes: nothing was written
    there), as logs/chunks.py drops them."""
    text = source.decode(data, final)
    if "\x00" in text:
        notes.nul_bytes += text.count("\x00")
        text = text.replace("\x00", "")
    return text


_M_TOP_PAD = -2  # glibc's mallopt parameter: heap kept past its top when it grows or shrinks


@functools.cache  # once per process
def keep_freed_memory() -> None:
    """Keep 64 MB of heap past its top. Each megabyte a Text's reading frees, glibc hands
    back to the kernel and faults in again for the next (a fifth of a big log's read went to
    page faults), where the C library has mallopt (glibc; elsewhere nothing is done)."""
    try:
        ctypes.CDLL(None).mallopt(_M_TOP_PAD, 64 << 20)
    except (OSError, AttributeError):
        pass


def _after_lines(data: bytes, n: int) -> int:
    """The offset just after `data`'s n-th line (its end if it holds fewer)."""
    pos = 0
    for _ in range(n):
        pos = data.find(b"\n", pos) + 1
        if pos == 0:
            return len(data)
    return pos


def _whole(data: bytes) -> bool:
    """`data` may go on as one Text: ASCII, no run of blank lines, no NUL, no line longer
    than MAX_LINE (only the first can be: the one a read continued)."""
    return (
        data.isascii()
        and _RUN not in data
        and b"\x00" not in data
        and data.find(b"\n", 0, MAX_LINE + 1) >= 0
    )
