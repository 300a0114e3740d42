"""A log file's text cut into lines a megabyte at a time, at C speed, surviving what a file does
to its lines: a run of blank lines (a flood of `\\n`, a 100 KB gzip of them) is handed on as one
`Blank` marker, never as millions of strings; a file with CR-only line endings (classic Mac,
some serial consoles and Windows tools) is split at its CRs; a hole of NUL bytes (a file
preallocated or cut by a crash, a sparse region) is dropped, so the text around it reads on;
a line longer than MAX_LINE is kept by its head and tail as it is read (a 20 MB flattened
log never sits whole in memory)."""

from __future__ import annotations

import codecs
import gzip
import itertools
import re
import zlib
from collections.abc import Iterable, Iterator
from typing import Protocol

from hicache_diag.logs.framing_notes import FramingNotes

MAX_LINE = 256 * 1024  # logs/lines.py reads a longer line by its head and tail
# Characters read at a time: no line inside one read is longer than MAX_LINE, so only the line
# a read continues from the one before can be (a Text's reads, TEXT_SIZE, are checked).
CHUNK = MAX_LINE
BLANK_RUN = 32  # blank lines in a row handed on as one Blank
_RUN = "\n" * BLANK_RUN
_KEEP = MAX_LINE // 2
# A run of blank (or blank-only) lines, each ended by its newline, starting at a line's start.
_BLANKS = re.compile(rf"(?:(?<=\n)|^)(?:[ \t]*\r?\n){{{BLANK_RUN},}}")


class Blank:
    """`n` blank lines in a row (the reader counts them, nothing else reads them)."""

    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        self.n = n

    def __repr__(self) -> str:
        return f"Blank({self.n})"


class Text:
    """A read's worth of whole lines, each ended by its newline, handed on unsplit (the hot
    path of a big log: logs/textblock.py reads it by its line shapes, at C speed). Only a
    read past the stream's first HEAD_ITEMS items, all ASCII, with no blank run, NUL or
    over-long line, comes as one; `lines()` is what it holds as read_lines' items."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def lines(self) -> list[str]:
        return self.text[:-1].split("\n")

    def __repr__(self) -> str:
        return f"Text({self.text.count(chr(10))} lines)"


# Characters a Text holds (whole reads joined): its per-Text costs paid once a megabyte.
TEXT_SIZE = 1024 * 1024
# Items read as lines before any Text: the stages that learn a stream from its first lines
# probe fewer (logs/shippers.py 100, then logs/paste.py 2000: tests/unit/triage/test_quiet.py).
HEAD_ITEMS = 2112


def expand(items: Iterable[str | Blank | Text]) -> Iterator[str | Blank]:
    """The items with each Text as its lines (a stage that reads every line on its own)."""
    for item in items:
        if type(item) is Text:
            yield from item.lines()
        else:
            yield item  # type: ignore[misc]


class _Text(Protocol):
    def read(self, size: int = -1, /) -> str: ...


class _Binary(Protocol):
    def read1(self, size: int = -1, /) -> bytes: ...


class Decoded:
    """A binary stream's text, decoded as it is read: each read takes what one read of the
    stream gives, so a gzip member cut short loses nothing read before its end (a text
    wrapper asks for more and drops what it held when the stream ends early)."""

    def __init__(self, binary: _Binary, encoding: str) -> None:
        self._binary = binary
        self._decoder = codecs.getincrementaldecoder(encoding)(errors="replace")
        self._done = False

    def read(self, size: int = -1, /) -> str:
        while not self._done:
            data = self._binary.read1(size)
            text = self._decoder.decode(data, final=not data)
            self._done = not data
            if text:
                return text
        return ""


def _bounded(line: str) -> str:
    if len(line) <= MAX_LINE:
        return line
    return f"{line[:_KEEP]} ... {line[-_KEEP:]}"


def _reads(text: _Text, cut: list[int], size: list[int]) -> Iterator[str]:
    """The text size[0] characters at a time (the reader may change it between reads); a
    gzip member without its end appends to `cut`."""
    while True:
        try:
            data = text.read(size[0])
        except EOFError:  # a gzip member without its end: keep what was read
            cut.append(1)
            return
        except (zlib.error, gzip.BadGzipFile) as exc:
            raise OSError(f"not a gzip stream ({exc})") from None
        if not data:
            return
        yield data


def read_lines(
    text: _Text,
    cut: list[int],
    cr_only: bool = False,
    notes: FramingNotes | None = None,
    texts: bool = False,
) -> Iterator[str | Blank | Text]:
    """The lines of `text` (without their newlines), with Blank for each run of BLANK_RUN or
    more blank lines; `cr_only`: the file ends its lines with CR alone. `notes` learns of the
    CR-only endings and the NUL bytes dropped. With `texts`, a read past the first HEAD_ITEMS
    items that holds only plain whole lines comes as one Text."""
    return itertools.chain.from_iterable(read_chunks(text, cut, cr_only, notes, texts))


def read_chunks(
    text: _Text,
    cut: list[int],
    cr_only: bool = False,
    notes: FramingNotes | None = None,
    texts: bool = False,
) -> Iterator[list[str | Blank | Text]]:
    """read_lines' items a chunk at a time (no generator step per line)."""
    notes = notes or FramingNotes()
    notes.cr_only = cr_only
    carry = ""
    given = 0 if texts and not cr_only else -1  # items handed on so far; -1: never a Text
    whole: list[str] = []  # reads that go on as one Text, TEXT_SIZE characters at a time
    size, read = 0, [CHUNK]
    for data in _reads(text, cut, read):
        if cr_only:
            data = data.replace("\r", "\n")
        if "\x00" in data:
            notes.nul_bytes += data.count("\x00")
            data = data.replace("\x00", "")  # a hole of NUL bytes: nothing was written there
        end = data.rfind("\n") + 1
        if end == 0:
            carry = _bounded(carry + data)
            continue
        first, data = carry + data[:end], data[end:]
        carry = _bounded(data)
        if given >= HEAD_ITEMS and _whole(first):
            read[0] = TEXT_SIZE  # the reads of a Text: a megabyte each (few pieces to join)
            whole.append(first)
            size += len(first)
            if size >= TEXT_SIZE // 2:  # a read of TEXT_SIZE is a Text on its own (no join)
                yield [Text("".join(whole))]
                whole, size = [], 0
            continue
        if whole:
            yield [Text("".join(whole))]
            whole, size = [], 0
        read[0] = CHUNK
        items = _split(first)
        if given >= 0:
            given += len(items)
        yield items
    if whole:
        yield [Text("".join(whole))]
    if carry:
        yield [carry]


def _whole(data: str) -> bool:
    """`data` may go on as one Text: ASCII (a line's characters are its bytes), no run of
    blank lines, no line longer than MAX_LINE (only the first can be: it continues a read)."""
    return data.isascii() and _RUN not in data and data.find("\n", 0, MAX_LINE + 1) >= 0


def _split(data: str) -> list[str | Blank]:
    """Lines of `data` (which ends with a newline), a run of blank lines as one Blank."""
    if data.isspace():  # a chunk of blank lines only: one test, no line objects
        return [Blank(data.count("\n"))]
    if _RUN not in data:
        return _lines(data)  # type: ignore[return-value]
    out: list[str | Blank] = []
    pos = 0
    for m in _BLANKS.finditer(data):
        if m.start() > pos:
            out += _lines(data[pos : m.start()])
        out.append(Blank(m.group().count("\n")))
        pos = m.end()
    if pos < len(data):
        out += _lines(data[pos:])
    return out


def _lines(data: str) -> list[str]:
    """`data` (ending with a newline) as its lines without newlines; a long line by head and
    tail."""
    lines = data[:-1].split("\n")
    if len(lines[0]) > MAX_LINE:  # the line a read continued (a CHUNK holds no longer one)
        lines[0] = _bounded(lines[0])
    if len(data) > 2 * CHUNK and max(map(len, lines)) > MAX_LINE:  # a Text-sized read's
        lines = list(map(_bounded, lines))
    return lines
