"""Paste damage undone before a log is read: editor line numbers, a terminal's wrap at its
width, line endings and colour codes, learned from the first lines (a paste is numbered or
wrapped from its first line); logs/lines.py runs it first. The same first lines teach
logs/framing.py the stream's unknown wrappers."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Iterator

from hicache_diag.logs.carriers import ANY_CARRIER, TS, carrier_names, peel
from hicache_diag.logs.chunks import MAX_LINE, Blank
from hicache_diag.logs.framing import Framing
from hicache_diag.logs.framing_notes import FramingNotes
from hicache_diag.logs.texts import Text, expand

_TS = TS
# ANSI SGR colours and other CSI sequences a coloured terminal or `docker logs` leaves in.
_ANSI = re.compile(r"\x1b\[[0-9;?]{0,32}[A-Za-z]|\x1b[()][A-Z0-9]")
# An editor's or `cat -n` / `grep -n` / `nl` line number in front of each line: `  12\t`,
# `12: `, `12 | `, `12→`, `[12] `. Only stripped when the next or previous line carries the next or
# previous number, so a line that merely starts with a figure keeps it.
_LINE_NO = re.compile(
    r"^ {0,8}(?:\[(?P<b>\d{1,7})\] ?|(?P<n>\d{1,7})(?:\t| ?[|\u2192] ?|:(?!\d) ?| {1,4}(?=\S)))"
)
# Common terminal widths: a paste whose longest lines are exactly one of these wide, with no
# line longer, was wrapped there (other widths need more evidence, see _wrap_width).
WRAP_WIDTHS = (80, 100, 120, 132, 140, 150, 160, 180, 200)
_WRAP_PROBE = 2000  # lines read ahead to find the wrap width
# A line that starts a record of its own is never the tail of a wrapped one.
_RECORD_START = re.compile(
    rf"^(?:\[{_TS}|\[(?:[A-Z]{{1,8}}(?:_[A-Z]{{1,8}})?\d{{1,5}} ?){{1,8}}\]|{_TS}\s"
    r"|Traceback \(|  File \"|\w[\w.-]{0,60}\s+\| )"
)


def _clean(lines: Iterable[str | Blank]) -> Iterator[str | Blank]:
    """Line endings (CRLF, a lone CR) and ANSI colour codes off every line."""
    for line in lines:
        yield line if type(line) is Blank else clean_line(line)  # type: ignore[arg-type]


def _wrap_width(head: list[str]) -> int | None:
    """The terminal width a paste was wrapped at, from its first lines; None if not wrapped.
    Wrapped text has no line longer than the width and several exactly that long that the next
    line continues: two at a common terminal width, three at any other (a resized window), one
    where nearly every line starts with a collector's prefix and the pieces after the
    full-width lines do not (they can only be the rest of the line before)."""
    longest = max((len(s) for s in head), default=0)
    if longest < 60:
        return None
    # A full-width line that the next one continues (it starts no record of its own): a log
    # whose templated lines merely share one length shows none.
    # A piece that starts as the line before it does (the same first field: a runner's tag on
    # every line of one template) is a record of its own, not the rest of that line.
    pieces = [
        b
        for a, b in itertools.pairwise(head)
        if len(a) == longest and b and not _RECORD_START.match(b) and not _same_start(a, b)
    ]
    need = 2 if longest in WRAP_WIDTHS else 3
    if pieces and len(pieces) < need and not any(map(ANY_CARRIER.match, pieces)):
        carried = sum(1 for s in head if s and ANY_CARRIER.match(s))
        need = 1 if carried >= 0.8 * (len(head) - len(pieces)) else need
    return longest if len(pieces) >= need else None


def _same_start(a: str, b: str) -> bool:
    """Both lines start with one short field of one shape (a tag), text after it."""
    first_a, first_b = a.split(" ", 1)[0], b.split(" ", 1)[0]
    if not 3 <= len(first_a) <= 60 or len(first_a) == len(a):
        return False
    return _DIGITS.sub("0", first_a) == _DIGITS.sub("0", first_b)


_DIGITS = re.compile(r"\d+")


def _numbered(head: list[str]) -> bool:
    """Two neighbouring lines carry consecutive editor line numbers."""
    prev: int | None = None
    for line in head:
        n = _number(_LINE_NO.match(line))
        if n is not None and prev is not None and n == prev + 1:
            return True
        prev = n
    return False


def _unwrap(lines: Iterable[str | Blank], width: int, notes: FramingNotes) -> Iterator[str | Blank]:
    """Join the pieces of lines a terminal wrapped at `width` back into one line."""
    pending: str | None = None
    for line in lines:
        if type(line) is Blank:  # blank lines end any wrapped line
            if pending is not None:
                yield pending
            pending = None
            yield line
            continue
        if len(line) > width:
            width = 10**9  # a longer line: this text was not wrapped after all
        if pending is not None and not _RECORD_START.match(line) and len(pending) < MAX_LINE:
            pending += line
            notes.joined += 1
        else:
            if pending is not None:
                yield pending
            pending = line
        if len(line) != width:
            yield pending
            pending = None
    if pending is not None:
        yield pending


def _number(m: re.Match[str] | None) -> int | None:
    return None if m is None else int(m["b"] or m["n"])


def _line_numbers(lines: Iterable[str | Blank]) -> Iterator[str | Blank]:
    """Drop editor line numbers: a number is one when a neighbour carries the next (or the
    previous) one."""
    prev_no: int | None = None  # the number stripped from the line before, if any
    held: tuple[str, re.Match[str] | None] | None = None
    for line in lines:
        if type(line) is Blank:
            if held is not None:
                yield from _release(held, None, prev_no)
            held, prev_no = None, None
            yield line
            continue
        m = _LINE_NO.match(line) if line[:1] in " [0123456789" else None
        if held is not None:
            prev_no = yield from _release(held, _number(m), prev_no)
        held = (line, m)
    if held is not None:
        yield from _release(held, None, prev_no)


def _release(held: tuple[str, re.Match[str] | None], next_no: int | None, prev_no: int | None):
    text, m = held
    n = _number(m)
    numbered = n is not None and (next_no == n + 1 or (prev_no is not None and n == prev_no + 1))
    yield text[m.end() :] if numbered and m is not None else text
    return n if numbered else None


def clean_line(line: str) -> str:
    """Line ending (CRLF, a lone CR) and ANSI colour codes off one line."""
    if line.endswith("\n"):
        line = line[:-2] if line.endswith("\r\n") else line[:-1]
    if "\r" in line:  # a progress bar redrawn with CR: keep what was drawn last
        line = line.rstrip("\r")
        line = line.rsplit("\r", 1)[-1] or line.replace("\r", "")
    if "\x1b" in line:
        line = _ANSI.sub("", line)
    return line


def _unnumbered(item: str | Blank) -> str | Blank:
    if type(item) is Blank or not (m := _LINE_NO.match(item)):  # type: ignore[arg-type]
        return item
    return item[m.end() :]  # type: ignore[index]


def paste_damage(
    raw: Iterator[str | Blank | Text], framing: Framing
) -> tuple[Iterator[str | Blank | Text], bool]:
    """Undo editor numbers and terminal wrap where the first lines show them (a paste is
    numbered or wrapped from its first line). Returns the lines and whether they are cleaned
    already; a plain log skips both stages and is cleaned in normalise's own loop. `framing`
    learns the stream's unknown wrappers from the same first lines, before any is read."""
    items = [x if type(x) is Blank else clean_line(x) for x in itertools.islice(raw, _WRAP_PROBE)]
    head = [x for x in items if type(x) is str]
    numbered = _numbered(head)
    if numbered:
        items = [_unnumbered(x) for x in items]
        head = [x for x in items if type(x) is str]
    width = _wrap_width(head)
    notes = framing.notes
    if width:  # the wrapper is learned from whole lines
        head = [x for x in _unwrap(iter(head), width, FramingNotes()) if type(x) is str]
    framing.learn([peel(h)[0] for h in head if not (h[:3] == "[20" and h[11:12] == " ")])
    notes.numbered, notes.wrap_width = numbered, width
    notes.carriers = carrier_names(head[:200])
    if not numbered and not width:
        return itertools.chain(items, raw), False
    rest: Iterable[str | Blank] = _clean(expand(raw))  # a paste's lines, each on its own
    if numbered:  # the head is stripped already; the rest goes through the stage
        rest = _line_numbers(rest)
    stream: Iterable[str | Blank] = itertools.chain(items, rest)
    if width:
        stream = _unwrap(stream, width, notes)
    return iter(stream), True
