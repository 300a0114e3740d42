"""Read a log file for triage: plain or gzip'd (by its first bytes), in the encoding its first
bytes show (UTF-8, UTF-8 with a BOM, UTF-16 with or without a BOM: PowerShell's `>` writes
UTF-16LE with one), streamed line by line into triage.logs, with the bytes read reported for a
progress display. A file that is no text at all (an ELF binary, an image, an archive) is
refused in one line naming what it looks like, never read as a log that says nothing.

A gzip stream cut short (a copy stopped mid-way, a rotated file still being written) is read
up to where it ends, as a paste cut short is, and the evidence says so: what it holds up to
the cut is real, and refusing it would hide the very lines a user has.
"""

from __future__ import annotations

import gzip
import io
import os
import re
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

from hicache_diag.logs.chunks import Blank, Decoded, read_lines
from hicache_diag.logs.framing_notes import FramingNotes
from hicache_diag.logs.model import LogEvidence
from hicache_diag.logs.parse import parse_log_lines
from hicache_diag.logs.texts import Text, read_items

_GZIP_MAGIC = b"\x1f\x8b"
_SNIFF = 4096  # bytes looked at to tell the encoding, or that it is no text
ReadProgress = Callable[[int, int], None]  # (bytes read, bytes in all) of the file on disk
# What a non-text file looks like, by its first bytes.
_MAGIC = (
    (b"\x7fELF", "an ELF binary"),
    (b"\x89PNG\r\n\x1a\n", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"GIF8", "a GIF image"),
    (b"%PDF", "a PDF document"),
    (b"PK\x03\x04", "a zip archive"),
    (b"\x28\xb5\x2f\xfd", "a zstd-compressed file"),
    (b"BZh", "a bzip2-compressed file"),
    (b"\xfd7zXZ\x00", "an xz-compressed file"),
    (b"7z\xbc\xaf\x27\x1c", "a 7z archive"),
    (b"SQLite format 3\x00", "an SQLite database"),
)
_BOMS = ((b"\xef\xbb\xbf", "utf-8-sig"), (b"\xff\xfe", "utf-16"), (b"\xfe\xff", "utf-16"))
# Bytes text never holds (NUL and the C0 controls but tab, newline, CR, form feed, ESC).
_CONTROL = bytes(b for b in range(1, 32) if b not in (9, 10, 12, 13, 27))
_NUL_RUN = re.compile(rb"\x00+")


class NotALog(ValueError):
    """The file is no text log: its message says what it looks like."""


def sniff_encoding(head: bytes) -> str:
    """The text encoding the first bytes show; raises NotALog for a file that is no text."""
    for bom, encoding in _BOMS:
        if head.startswith(bom):
            return encoding
    for magic, what in _MAGIC:
        if head.startswith(magic):
            raise NotALog(f"not a log: {what}")
    if len(head) >= 4 and head.count(0) * 3 >= len(head):  # UTF-16 without a BOM
        evens, odds = head[0::2].count(0), head[1::2].count(0)
        if odds > 2 * evens:
            return "utf-16-le"
        if evens > 2 * odds:
            return "utf-16-be"
    if _binary(head):
        raise NotALog("not a log: binary data")
    return "utf-8"


def _binary(head: bytes) -> bool:
    """Bytes no text holds: control characters in number, or NULs scattered through it. A hole
    of NULs (one or a few runs: a file preallocated or cut by a crash) is text around a hole."""
    holes = len(_NUL_RUN.findall(head))
    controls = sum(head.count(c) for c in _CONTROL)
    return holes > 4 or controls * 10 > max(1, len(head) - head.count(0))


def decode_text(data: bytes) -> str:
    """A small text file's content (a saved stack dump) in the encoding its first bytes show;
    raises NotALog when it is no text."""
    encoding = sniff_encoding(data[:_SNIFF])
    return data.decode(encoding, errors="replace")


def parse_log_file(path: Path, progress: ReadProgress | None = None) -> LogEvidence:
    """Stream one log (gzip'd or plain, by its first bytes; in the encoding they show)
    through the parser. Raises OSError when unreadable and NotALog when it is no text (the
    CLI turns either into a one-line usage error)."""
    with open(path, "rb") as raw:
        total = os.fstat(raw.fileno()).st_size
        gz = raw.read(2) == _GZIP_MAGIC
        raw.seek(0)
        stream: io.BufferedIOBase = gzip.GzipFile(fileobj=raw) if gz else raw  # type: ignore[assignment]
        head = _peek(stream)
        encoding = sniff_encoding(head)
        text = Decoded(stream, encoding)
        on_line = (lambda _n: progress(raw.tell(), total)) if progress else None
        cut: list[int] = []
        notes = FramingNotes()
        cr_only = _cr_only(head, encoding)
        if encoding.startswith("utf-8") and not cr_only:  # read as bytes, plain runs as Texts
            lines: Iterator[str | Blank | Text] = read_items(text, cut, notes)
        else:
            lines = read_lines(text, cut, cr_only=cr_only, notes=notes)
        ev = parse_log_lines(lines, str(path), on_line, notes=notes)
    if cut:
        ev.notes.append(
            f"{path}: the gzip stream is cut short (no end-of-stream marker); read the "
            f"{ev.lines} lines before the cut"
        )
    return ev


def _cr_only(head: bytes, encoding: str) -> bool:
    """The file ends its lines with a lone CR (no LF in its first bytes, several CRs)."""
    text = head.decode(encoding, errors="ignore")
    return "\n" not in text and text.count("\r") >= 2


def _peek(stream: io.BufferedIOBase) -> bytes:
    """The first bytes without consuming them (a cut gzip may end inside them)."""
    try:
        return stream.peek(_SNIFF)[:_SNIFF]  # type: ignore[attr-defined]
    except EOFError:
        return b""
    except (zlib.error, gzip.BadGzipFile) as exc:  # gzip's magic, then no deflate stream
        raise OSError(f"not a gzip stream ({exc})") from None
