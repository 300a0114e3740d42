"""Read one Python traceback out of a log window: its frames, files, exception type and
message, where it ends; a traceback whose exception line never comes is cut short. A paste
that lost every indent (`File "..."` and the code line both at column 0) is read too: after an
unindented frame the next line is its code unless it reads as an exception line."""

from __future__ import annotations

import re
from dataclasses import dataclass

from hicache_diag.logs.model import CUT_SHORT
from hicache_diag.logs.window import LineWindow
from hicache_diag.rules.rank_labels import split_prefix

# The longest block (traceback, py-spy dump, faulthandler dump) read ahead of the current line.
MAX_BLOCK = 5000
TRACEBACK = "Traceback (most recent call last):"
# `in <module>` may be lost (a paste eaten as an HTML tag): `line 78, in` then nothing.
_FRAME = re.compile(r'^(\s*)File "(.+?)", line (\d+), in ?(.*)$')
_EXC_LINE = re.compile(
    r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Warning)?)(?::\s?(.*))?$"
)
# An exception line for sure (a frame's unindented code line is never one of these).
_SURE_EXC = re.compile(
    r"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Interrupt|Exit|Warning)(?::\s?.*)?$"
)


@dataclass(slots=True)
class Traceback:
    frames: list[str]
    files: list[str]
    exc_type: str
    message: str
    end: int  # index of its last line
    last_frame: str | None


def _body(line: str) -> str:
    """A line of the traceback without the rank label a per-line prefix left on every line
    (a worker's `(Worker_TP10 pid=N) ` kept as `[TP10] `: logs/speakers.py)."""
    if line[:1] == "[" and (parts := split_prefix(line)) is not None and parts[2][:1].isspace():
        return parts[2]
    return line


def _message(line: str) -> str:
    parts = split_prefix(line) if line[:1] == "[" or line[:1].isdigit() else None
    return (parts[2] if parts else line).strip()


def is_frame(line: str) -> bool:
    """A traceback's `File "...", line N, in f` line (indented or not)."""
    return _FRAME.match(line) is not None


def read_traceback(lines: LineWindow, start: int, headless: bool = False) -> Traceback:
    """Frames, exception type and message of the traceback whose header is at `start`; with
    `headless`, `start` is its first frame (the header was cut off or never printed)."""
    frames: list[str] = []
    files: list[str] = []
    last: re.Match[str] | None = None
    code_next = False  # an unindented frame: its code line comes next, at column 0 too
    i = start if headless else start + 1
    while lines.has(i) and i - start < MAX_BLOCK:
        raw = _body(lines[i])
        if m := _FRAME.match(raw):
            frames.append(m.group(4).strip() or "<module>")
            files.append(m.group(2))
            last, code_next = m, not m.group(1)
        elif raw.startswith(("During handling", "The above exception", TRACEBACK)) or not raw:
            code_next = False
        elif raw[0].isspace() or (code_next and not _SURE_EXC.match(raw.strip())):
            code_next = False  # a code line or a `^^^` marker
        elif headless and not _SURE_EXC.match(_message(raw)):
            break  # another record: these frames were no traceback's (or its end is lost)
        else:
            where = f"{last[4].strip()} ({last[2].rsplit('/', 1)[-1]}:{last[3]})" if last else None
            text = _message(raw)
            m = _EXC_LINE.match(text)
            if m:
                return Traceback(frames, files, m.group(1), (m.group(2) or "").strip(), i, where)
            return Traceback(frames, files, text[:80], "", i, where)
        i += 1
    return Traceback(frames, files, "UnknownError", CUT_SHORT, i - 1, None)
