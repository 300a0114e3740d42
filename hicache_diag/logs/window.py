"""A sliding window over a stream of lines: the log reader's handlers index it like a list
and look ahead for a block (a traceback, a dump); lines behind the reader are forgotten, so
memory is bounded by the longest block, not by the log. The stream may hand over runs of plain
lines as one `Block` (triage.lines): the reader takes a whole one at a time with `block`, and a
handler that looks ahead into one sees its lines."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from hicache_diag.logs.block import Block
from hicache_diag.logs.chunks import Blank
from hicache_diag.logs.textblock import TextBlock


class LineWindow:
    """The normalised lines as a sliding window over the stream: handlers index it like a list
    (`lines[i]`, `lines.has(i)`, slices), and lines before the one being read are forgotten."""

    def __init__(self, lines: Iterable[str | Block | Blank | TextBlock]) -> None:
        self._it: Iterator[str | Block | Blank | TextBlock] = iter(lines)
        self._buf: list[str] = []
        self._base = 0  # stream index of _buf[0]
        # items handed back, read before the stream (a stack)
        self._back: list[str | Block | Blank | TextBlock] = []

    def _next(self) -> str | Block | Blank | TextBlock | None:
        return self._back.pop() if self._back else next(self._it, None)

    def has(self, i: int) -> bool:
        while i >= self._base + len(self._buf):
            nxt = self._next()
            if nxt is None:
                return False
            if type(nxt) is Block:
                self._buf += nxt.rest()
            elif type(nxt) is TextBlock:
                self._buf += nxt.block().rest()
            elif type(nxt) is Blank:  # only the blank lines a look-ahead needs, the rest later
                need = min(nxt.n, i - self._base - len(self._buf) + 1)
                self._buf += [""] * need
                if nxt.n > need:
                    self._back.append(Blank(nxt.n - need))
            else:
                self._buf.append(nxt)  # type: ignore[arg-type]
        return i >= self._base

    def __getitem__(self, i: int) -> str:
        if not self.has(i):
            raise IndexError(i)
        return self._buf[i - self._base]

    def slice(self, start: int, end: int) -> list[str]:
        self.has(end - 1)
        return self._buf[max(start - self._base, 0) : end - self._base]

    def take(self, i: int, blocks: bool = False) -> str | Block | Blank | TextBlock | None:
        """Line i, forgetting the lines before it; None past the end. Reading goes forward
        only, so once i passes the buffered lines the buffer starts afresh at i. With `blocks`,
        a Block or TextBlock that starts at i is returned whole (the reader records it at
        once)."""
        buf = self._buf
        k = i - self._base
        if k == len(buf) == 1 and not self._back:  # the usual case: the next line, in place
            nxt = next(self._it, None)
            if type(nxt) is str:
                self._base = i
                buf[0] = nxt
                return nxt  # type: ignore[return-value]
            if nxt is not None:
                self._back.append(nxt)
        if k >= len(buf):
            self._base += len(buf)
            buf.clear()
            if blocks and i == self._base:
                nxt = self._next()
                if type(nxt) is Block or type(nxt) is TextBlock:
                    return nxt
                if type(nxt) is Blank:  # the reader counts them; the window skips past
                    self._base = i + nxt.n
                    return nxt
                if nxt is not None:
                    self._back.append(nxt)
            if not self.has(i):
                return None
            if k := i - self._base:
                del buf[:k]
                self._base = i
            return buf[0]
        if k >= 64:
            del buf[:k]
            self._base, k = i, 0
        return buf[k]

    def expand(self, block: Block) -> None:
        """Hand a Block taken whole back as its lines, each read on its own."""
        self._back.extend(reversed(block.rest()))

    def passed(self, i: int) -> None:
        """The reader recorded a whole block: its next line is stream index i."""
        self._base = i

    def resume(self, block: Block, i: int) -> None:
        """The reader recorded `block` up to its line `block.start`, stream index i. If lines
        are left, that line goes to the full path on its own and the rest stays a Block."""
        self._base = i
        if block.start >= len(block.raw):
            return
        line = block.line(block.start)
        block.start += 1
        if block.start < len(block.raw):
            self._back.append(block)
        self._back.append(line)
