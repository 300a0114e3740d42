"""Rank logs -> the crash each rank hit: exception line, form hint, last frame and time."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

# SGLang's log prefix "[2026-05-26 15:19:18 PP2 ATTN_CP2 TP2] "; ours has the same shape.
_PREFIX = re.compile(r"^\[(?P<ts>\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?)?[^\]]*\]\s?")
SHAPE_RE = re.compile(r"shape '\[(\d+), -1, (\d+)\]' is invalid for input of size (\d+)")
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')
_EXC_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit|Warning)\b(:.*)?$")
_BOOKKEEPING = ("ongoing_write_through", "ongoing_load_back")
# The cascade on survivors once a peer died: secondary, never the root cause.
SECONDARY = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "ECONNRESET",
    "Socket closed",
)


@dataclass(frozen=True, slots=True)
class RankCrash:
    rank: int
    kind: str  # "A" | "B" | "secondary" | "other"
    signature: str  # the exception line
    where: str | None  # the last frame, "func (file.py:line)"
    t: float | None  # when it was logged (epoch seconds), when the log says
    text: str  # the traceback


def _strip(line: str) -> str:
    return _PREFIX.sub("", line, count=1)


def _timestamp(line: str) -> float | None:
    m = _PREFIX.match(line)
    if not m or not m.group("ts"):
        return None
    try:
        return datetime.fromisoformat(m.group("ts").replace(",", ".")).timestamp()
    except ValueError:
        return None


def _last_traceback(lines: list[str]) -> tuple[int, list[str]] | None:
    starts = [i for i, ln in enumerate(lines) if "Traceback (most recent call last)" in ln]
    if not starts:
        return None
    # Chained exceptions: the first block is where the failure began; keep from there on.
    first = starts[0]
    return first, [_strip(ln) for ln in lines[first:]]


def _exception_line(block: list[str]) -> str:
    candidates = [ln.strip() for ln in block if _EXC_LINE.match(ln.strip())]
    return candidates[-1] if candidates else block[-1].strip()


def _last_frame(block: list[str]) -> str | None:
    frames = [m for m in (_FRAME.match(ln) for ln in block) if m]
    if not frames:
        return None
    m = frames[-1]
    return f"{m['func']} ({m['file'].rsplit('/', 1)[-1]}:{m['line']})"


def _kind(text: str, signature: str) -> str:
    if SHAPE_RE.search(text):
        return "A"
    if "pop from empty list" in text:
        return "B"
    if "KeyError" in text and any(name in text for name in _BOOKKEEPING):
        return "B"
    if any(s in text for s in SECONDARY):
        return "secondary"
    return "other"


def parse_crash(rank: int, log: str) -> RankCrash | None:
    """The crash a rank's log shows, or None when it holds no traceback."""
    lines = log.splitlines()
    found = _last_traceback(lines)
    if found is None:
        return None
    index, block = found
    text = "\n".join(block)
    signature = _exception_line(block)
    t = None
    for ln in reversed(lines[max(0, index - 3) : index + 1]):
        t = _timestamp(ln)
        if t is not None:
            break
    return RankCrash(rank, _kind(text, signature), signature, _last_frame(block), t, text)
