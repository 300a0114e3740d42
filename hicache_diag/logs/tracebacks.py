"""Read one Python traceback out of a log window: its frames, files, exception type and
message, where it ends; a traceback whose exception line never comes is cut short."""

from __future__ import annotations

import re
from dataclasses import dataclass

from hicache_diag.logs.model import CUT_SHORT
from hicache_diag.logs.window import LineWindow
from hicache_diag.rules.rank_labels import split_prefix

# The longest block (traceback, py-spy dump, faulthandler dump) read ahead of the current line.
MAX_BLOCK = 5000
TRACEBACK = "Traceback (most recent call last):"
_FRAME = re.compile(r'^\s+File "(.+?)", line (\d+), in (.+)$')
_EXC_LINE = re.compile(
    r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Warning)?)(?::\s?(.*))?$"
)


@dataclass(slots=True)
class Traceback:
    frames: list[str]
    files: list[str]
    exc_type: str
    message: str
    end: int  # index of its last line
    last_frame: str | None


def read_traceback(lines: LineWindow, start: int) -> Traceback:
    """Frames, exception type and message of the traceback whose header is at `start`."""
    frames: list[str] = []
    files: list[str] = []
    last: re.Match[str] | None = None
    i = start + 1
    while lines.has(i) and i - start < MAX_BLOCK:
        raw = lines[i]
        if m := _FRAME.match(raw):
            frames.append(m.group(3).strip())
            files.append(m.group(1))
            last = m
        elif raw.startswith(("During handling", "The above exception", TRACEBACK)) or not raw:
            pass
        elif not raw[0].isspace():
            where = f"{last[3].strip()} ({last[1].rsplit('/', 1)[-1]}:{last[2]})" if last else None
            parts = split_prefix(raw) if raw[:1] == "[" or raw[:1].isdigit() else None
            text = (parts[2] if parts else raw).strip()
            m = _EXC_LINE.match(text)
            if m:
                return Traceback(frames, files, m.group(1), (m.group(2) or "").strip(), i, where)
            return Traceback(frames, files, text[:80], "", i, where)
        i += 1
    return Traceback(frames, files, "UnknownError", CUT_SHORT, i - 1, None)
