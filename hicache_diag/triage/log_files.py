"""Read a log file for triage: plain or gzip'd (by its first bytes), streamed line by line
into triage.logs, with the bytes read reported for a progress display."""

from __future__ import annotations

import gzip
import io
import itertools
import os
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

from hicache_diag.triage.log_model import LogEvidence
from hicache_diag.triage.logs import parse_log_lines

_GZIP_MAGIC = b"\x1f\x8b"
Progress = Callable[[int, int], None]  # (bytes read, bytes in all) of the file on disk


def parse_log_file(path: Path, progress: Progress | None = None) -> LogEvidence:
    """Stream one log (gzip'd or plain, by its first bytes) through the parser. Raises OSError
    when unreadable (the CLI turns that into a one-line usage error); a gzip stream cut short
    is read up to where it ends, as a paste cut short is."""
    with open(path, "rb") as raw:
        total = os.fstat(raw.fileno()).st_size
        gz = raw.read(2) == _GZIP_MAGIC
        raw.seek(0)
        stream: io.BufferedIOBase = gzip.GzipFile(fileobj=raw) if gz else raw  # type: ignore[assignment]
        text = io.TextIOWrapper(stream, encoding="utf-8", errors="replace", newline="\n")
        on_line = (lambda _n: progress(raw.tell(), total)) if progress else None
        return parse_log_lines(_lines(text), str(path), on_line)


def _lines(text: io.TextIOWrapper) -> Iterator[str]:
    return itertools.chain.from_iterable(_chunks(text))


def _chunks(text: io.TextIOWrapper) -> Iterator[list[str]]:
    """The file's lines a few thousand at a time (no generator step per line)."""
    while True:
        chunk: list[str] = []
        try:
            chunk.extend(itertools.islice(text, 4096))
        except EOFError:  # a gzip member without its end: keep what was read
            yield chunk
            return
        except zlib.error as exc:  # gzip's magic, then no deflate stream: bad input
            raise OSError(f"not a gzip stream ({exc})") from None
        if not chunk:
            return
        yield chunk
