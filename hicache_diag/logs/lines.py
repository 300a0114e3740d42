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
import re
from collections.abc import Iterable, Iterator

from hicache_diag.logs.carriers import ANY_CARRIER, TRACEBACK, TS, peel, unflatten_traceback
from hicache_diag.logs.framing import Framing

_TS = TS
_TRACEBACK = TRACEBACK
# ANSI SGR colours and other CSI sequences a coloured terminal or `docker logs` leaves in.
_ANSI = re.compile(r"\x1b\[[0-9;?]{0,32}[A-Za-z]|\x1b[()][A-Z0-9]")
# An editor's or `cat -n` / `grep -n` / `nl` line number in front of each line: `  12\t`,
# `12: `, `12 | `, `12→`, `[12] `. Only stripped when the next or previous line carries the next or
# previous number, so a line that merely starts with a figure keeps it.
_LINE_NO = re.compile(
    r"^ {0,8}(?:\[(?P<b>\d{1,7})\] ?|(?P<n>\d{1,7})(?:\t| ?[|\u2192] ?|:(?!\d) ?| {1,4}(?=\S)))"
)
# An SGLang prefix glued onto the end of the previous line (two writers on one stream).
_GLUED = re.compile(
    r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?(?: [A-Z]{1,8}(?:_[A-Z]{1,8})?\d{1,5}){0,8}\] "
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


def _clean(lines: Iterable[str]) -> Iterator[str]:
    """Line endings (CRLF, a lone CR) and ANSI colour codes off every line."""
    for line in lines:
        yield _clean_line(line)


def _wrap_width(head: list[str]) -> int | None:
    """The terminal width a paste was wrapped at, from its first lines; None if not wrapped.
    Wrapped text has no line longer than the width and several exactly that long that the next
    line continues: two at a common terminal width, three at any other (a resized window)."""
    longest = max((len(s) for s in head), default=0)
    if longest < 60:
        return None
    # A full-width line that the next one continues (it starts no record of its own): a log
    # whose templated lines merely share one length shows none.
    cut = sum(
        1
        for a, b in itertools.pairwise(head)
        if len(a) == longest and b and not _RECORD_START.match(b)
    )
    return longest if cut >= (2 if longest in WRAP_WIDTHS else 3) else None


def _numbered(head: list[str]) -> bool:
    """Two neighbouring lines carry consecutive editor line numbers."""
    prev: int | None = None
    for line in head:
        n = _number(_LINE_NO.match(line))
        if n is not None and prev is not None and n == prev + 1:
            return True
        prev = n
    return False


def _unwrap(lines: Iterable[str], width: int) -> Iterator[str]:
    """Join the pieces of lines a terminal wrapped at `width` back into one line."""
    pending: str | None = None
    for line in lines:
        if len(line) > width:
            width = 10**9  # a longer line: this text was not wrapped after all
        if pending is not None and not _RECORD_START.match(line) and len(pending) < MAX_LINE:
            pending += line
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


def _line_numbers(lines: Iterable[str]) -> Iterator[str]:
    """Drop editor line numbers: a number is one when a neighbour carries the next (or the
    previous) one."""
    prev_no: int | None = None  # the number stripped from the line before, if any
    held: tuple[str, re.Match[str] | None] | None = None
    for line in lines:
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


def _clean_line(line: str) -> str:
    """Line ending (CRLF, a lone CR) and ANSI colour codes off one line."""
    if line.endswith("\n"):
        line = line[:-2] if line.endswith("\r\n") else line[:-1]
    if "\r" in line:  # a progress bar redrawn with CR: keep what was drawn last
        line = line.rstrip("\r")
        line = line.rsplit("\r", 1)[-1] or line.replace("\r", "")
    if "\x1b" in line:
        line = _ANSI.sub("", line)
    return line


def _paste_damage(raw: Iterator[str], framing: Framing) -> tuple[Iterator[str], bool]:
    """Undo editor numbers and terminal wrap where the first lines show them (a paste is
    numbered or wrapped from its first line). Returns the lines and whether they are cleaned
    already; a plain log skips both stages and is cleaned in normalise's own loop. `framing`
    learns the stream's unknown wrappers from the same first lines, before any is read."""
    head = [_clean_line(line) for line in itertools.islice(raw, _WRAP_PROBE)]
    numbered = _numbered(head)
    if numbered:
        head = [h[m.end() :] if (m := _LINE_NO.match(h)) else h for h in head]
    framing.learn([peel(h)[0] for h in head if not (h[:3] == "[20" and h[11:12] == " ")])
    width = _wrap_width(head)
    if not numbered and not width:
        return itertools.chain(head, raw), False
    rest: Iterable[str] = _clean(raw)
    if numbered:  # the head is stripped already; the rest goes through the stage
        rest = _line_numbers(rest)
    stream: Iterable[str] = itertools.chain(head, rest)
    if width:
        stream = _unwrap(stream, width)
    return iter(stream), True


# A line longer than this (a tensor's repr, a base64 blob, a batch of requests) is read by its
# head and tail: what a line means is in its prefix, its first words and its end, and every
# stage after this one then works on a bounded line, however long the input.
MAX_LINE = 256 * 1024
_KEEP_END = MAX_LINE // 2


def _bounded(line: str) -> str:
    if len(line) <= MAX_LINE:
        return line
    return f"{line[:_KEEP_END]} ... {line[-_KEEP_END:]}"


class Block:
    """A run of plain SGLang log lines that normalising leaves as they are but for their
    newline (each starts with SGLang's own `[20..-..-.. ` prefix; no carrier, colour, CR, glued
    prefix or traceback): the log reader records them without per-line handlers. `raw` holds
    them as read (each with its newline when `nl` is 1); `start` is the first not yet read."""

    __slots__ = ("raw", "nl", "start", "hicache_words")

    def __init__(self, raw: list[str], nl: int) -> None:
        self.raw = raw
        self.nl = nl
        self.start = 0
        self.hicache_words: bool | None = None  # a line may name HiCache (the reader's test)

    def line(self, k: int) -> str:
        return self.raw[k][: len(self.raw[k]) - self.nl]

    def rest(self) -> list[str]:
        """The lines from `start` on, newlines off (a handler that looks ahead into them)."""
        raw = self.raw[self.start :]
        return [s[:-1] for s in raw] if self.nl else raw


BLOCK_LINES = 2048  # lines per block: long enough to pay for its tests, short for the window
_NL = itertools.repeat("\n")
_ISO_BRACKET = re.compile(r"\[\d{4}-\d\d-\d\dT")


def _plain_block(chunk: list[str]) -> Block | None:
    """The chunk as a Block when normalise would leave every line as it is (less its newline),
    else None. Lines come from a file (each ends with one newline) or a list (none has one).
    Only C-level scans of the chunk here: this runs on every line of a big log."""
    text = "".join(chunk)
    newlines = text.count("\n")
    if newlines == 0:
        nl, text = 0, "\n".join(chunk)
    elif newlines == len(chunk) and all(map(str.endswith, chunk, _NL)):
        nl = 1
    else:
        return None
    if (
        "\r" in text
        or "\x1b" in text
        or _TRACEBACK in text
        or max(map(len, chunk)) > MAX_LINE
        # SGLang's `[2026-06-24 ...` starts every line (so no carrier can but the bracketed
        # ISO stamp: normalise's carrier scan would change nothing)
        or text[:3] != "[20"
        or text.count("\n[20") != len(chunk) - 1
        or _ISO_BRACKET.search(text)
    ):
        return None
    # A prefix glued after a non-blank inside a line: only where a `[` is not a line's first.
    if text.count("[") != len(chunk) and any(
        not text[m.start() - 1].isspace() for m in _GLUED.finditer(text, 1)
    ):
        return None
    return Block(chunk, nl)


def normalise(raw: Iterable[str]) -> Iterator[str]:
    """Every carrier undone, wrapped / partial lines joined, glued and flattened lines split."""
    for item in normalise_blocks(raw):
        if type(item) is Block:
            yield from item.rest()
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
        or (line.find("[", 1) > 0 and _glue_points(line))
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


def normalise_blocks(raw: Iterable[str]) -> Iterator[str | Block]:
    """normalise's lines, with runs of plain SGLang lines handed on as Blocks (the hot path of
    a big log: a busy server's batch lines); every other line goes through each stage."""
    state = _Stages()
    lines, cleaned = _paste_damage(iter(raw), state.framing)
    while chunk := list(itertools.islice(lines, BLOCK_LINES)):
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
    yield from state.end()


class _Stages:
    """normalise's stages for one line at a time, holding a CRI partial line until its end."""

    __slots__ = ("partial", "framing")

    def __init__(self) -> None:
        self.partial = ""
        self.framing = Framing()  # wrappers no carrier names, learned from this stream

    def line(self, line: str, cleaned: bool = False) -> Iterator[str]:
        if len(line) > MAX_LINE:
            line = _bounded(line)
        if cleaned:
            pass
        elif "\r" in line or "\x1b" in line:
            line = _clean_line(line)
        elif line[-1:] == "\n":
            line = line[:-1]  # the usual line: its newline off without a call
        # `[2026-06-24 15:38:03 ...` is SGLang's prefix, never a carrier: skip the carrier scan.
        if not (line[:3] == "[20" and line[11:12] == " ") and ANY_CARRIER.match(line):
            text, continued = peel(line)
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
        if line.find("[", 1) < 0 and _TRACEBACK not in line:
            yield line
        else:
            yield from _split_glued(line)

    def end(self) -> Iterator[str]:
        if self.partial:
            yield from _split_glued(peel(self.partial)[0])


def _split_glued(line: str) -> Iterator[str]:
    if line.find("[", 1) > 0 and (cuts := _glue_points(line)):
        pieces = [line[a:b] for a, b in zip([0, *cuts], [*cuts, len(line)], strict=True)]
    else:
        pieces = [line]
    for piece in pieces:
        if _TRACEBACK in piece:
            yield from unflatten_traceback(piece)
        else:
            yield piece


def _glue_points(line: str) -> list[int]:
    """Where an SGLang prefix starts in the middle of a line, right after a non-blank."""
    return [m.start() for m in _GLUED.finditer(line, 1) if not line[m.start() - 1].isspace()]
