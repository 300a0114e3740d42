"""A log file's text cut into lines 256 KB at a time, at C speed, surviving what a file does
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
from collections.abc import Callable, Iterator
from typing import Protocol, TypeVar

from hicache_diag.logs.framing_notes import FramingNotes

MAX_LINE = 256 * 1024  # logs/lines.py reads a longer line by its head and tail
# Characters read at a time: no line inside one read is longer than MAX_LINE, so only the line
# a read continues from the one before can be (logs/texts.py's bigger reads check theirs).
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


_Read = TypeVar("_Read", str, bytes)


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

    def raw(self, size: int) -> bytes:
        """One read of the stream's bytes, not decoded (b"" at its end)."""
        data = b"" if self._done else self._binary.read1(size)
        self._done = not data
        return data

    def decode(self, data: bytes, final: bool = False) -> str:
        """Bytes `raw` gave, decoded (a character they end inside waits for the next)."""
        return self._decoder.decode(data, final=final)

    def read(self, size: int = -1, /) -> str:
        while not self._done:
            data = self._binary.read1(size)
            text = self._decoder.decode(data, final=not data)
            self._done = not data
            if text:
                return text
        return ""


def bounded(line: str) -> str:
    if len(line) <= MAX_LINE:
        return line
    return f"{line[:_KEEP]} ... {line[-_KEEP:]}"


def reads(read: Callable[[], _Read], cut: list[int]) -> Iterator[_Read]:
    """What `read()` gives, a read at a time, until it gives nothing; a gzip member without
    its end appends to `cut` (what was read before it is kept)."""
    while True:
        try:
            data = read()
        except EOFError:  # a gzip member without its end: keep what was read
            cut.append(1)
            return
        except (zlib.error, gzip.BadGzipFile) as exc:
            raise OSError(f"not a gzip stream ({exc})") from None
        if not data:
            return
        yield data


def read_lines(
    text: _Text, cut: list[int], cr_only: bool = False, notes: FramingNotes | None = None
) -> Iterator[str | Blank]:
    """The lines of `text` (without their newlines), with Blank for each run of BLANK_RUN or
    more blank lines; `cr_only`: the file ends its lines with CR alone. `notes` learns of the
    CR-only endings and the NUL bytes dropped."""
    return itertools.chain.from_iterable(read_chunks(text, cut, cr_only, notes))


def read_chunks(
    text: _Text,
    cut: list[int],
    cr_only: bool = False,
    notes: FramingNotes | None = None,
    carry: str = "",
) -> Iterator[list[str | Blank]]:
    """read_lines' items a chunk at a time (no generator step per line); `carry`: the start
    of the line the text goes on with (logs/texts.py hands its reading over)."""
    notes = notes or FramingNotes()
    notes.cr_only = cr_only
    for data in reads(lambda: text.read(CHUNK), cut):
        if cr_only:
            data = data.replace("\r", "\n")
        if "\x00" in data:
            notes.nul_bytes += data.count("\x00")
            data = data.replace("\x00", "")  # a hole of NUL bytes: nothing was written there
        end = data.rfind("\n") + 1
        if end == 0:
            carry = bounded(carry + data)
            continue
        first, data = carry + data[:end], data[end:]
        carry = bounded(data)
        yield split_lines(first)
    if carry:
        yield [carry]


def split_lines(data: str) -> list[str | Blank]:
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
        lines[0] = bounded(lines[0])
    if len(data) > 2 * CHUNK and max(map(len, lines)) > MAX_LINE:  # a Text-sized read's
        lines = list(map(bounded, lines))
    return lines
