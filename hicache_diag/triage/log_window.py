"""A sliding window over a stream of lines: the log reader's handlers index it like a list
and look ahead for a block (a traceback, a dump); lines behind the reader are forgotten, so
memory is bounded by the longest block, not by the log."""

from __future__ import annotations

from collections.abc import Iterable, Iterator


class LineWindow:
    """The normalised lines as a sliding window over the stream: handlers index it like a list
    (`lines[i]`, `lines.has(i)`, slices), and lines before the one being read are forgotten."""

    def __init__(self, lines: Iterable[str]) -> None:
        self._it: Iterator[str] = iter(lines)
        self._buf: list[str] = []
        self._base = 0  # stream index of _buf[0]

    def has(self, i: int) -> bool:
        while i >= self._base + len(self._buf):
            nxt = next(self._it, None)
            if nxt is None:
                return False
            self._buf.append(nxt)
        return i >= self._base

    def __getitem__(self, i: int) -> str:
        if not self.has(i):
            raise IndexError(i)
        return self._buf[i - self._base]

    def slice(self, start: int, end: int) -> list[str]:
        self.has(end - 1)
        return self._buf[max(start - self._base, 0) : end - self._base]

    def take(self, i: int) -> str | None:
        """Line i, forgetting the lines before it; None past the end. Reading goes forward
        only, so once i passes the buffered lines the buffer starts afresh at i."""
        buf = self._buf
        k = i - self._base
        if k == len(buf) == 1:  # the usual case: the next line of the stream, in place
            self._base = i
            nxt = next(self._it, None)
            if nxt is None:
                buf.clear()
            else:
                buf[0] = nxt
            return nxt
        if k >= len(buf):
            skip = k - len(buf)  # lines never read into the buffer (none in practice)
            buf.clear()
            self._base = i
            for _ in range(skip):
                next(self._it, None)
            nxt = next(self._it, None)
            if nxt is not None:
                buf.append(nxt)
            return nxt
        if k >= 64:
            del buf[:k]
            self._base, k = i, 0
        return buf[k]
