"""The shared stderr console: progress, logs and panels never touch stdout (that is for --json).

Every console here is a `SafeConsole`: text that came from an input (a log line, a verdict.json
field, a file name) is drawn with its control characters as visible symbols (ESC as ␛), so a
file cannot move the cursor, retitle or clear the user's terminal; rich's own styling and cursor
control (its control segments) pass unchanged. A COLUMNS or LINES that is not a positive number
(COLUMNS=0 drew nothing) is dropped before any console reads it."""

from __future__ import annotations

import json
import os
import re
import sys
from typing import Any

from rich.console import Console
from rich.segment import Segment

# C0 controls but newline and tab, DEL, and the C1 controls (0x9b is a one-byte CSI).
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _picture(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x20:
        return chr(0x2400 + code)  # the Unicode control pictures: ␛ for ESC, ␍ for CR
    return "\u2421" if code == 0x7F else "\ufffd"


def escape_controls(text: str) -> str:
    """`text` with every control character but newline and tab shown, never obeyed."""
    return _CONTROLS.sub(_picture, text)


class SafeConsole(Console):
    """A rich Console that escapes control characters in the text it draws (see above)."""

    def _render_buffer(self, buffer):  # rich's one place that turns segments into output
        safe = (
            seg if seg.control else Segment(escape_controls(seg.text), seg.style) for seg in buffer
        )
        return super()._render_buffer(safe)


def drop_bad_terminal_size(environ: dict[str, str] | os._Environ = os.environ) -> list[str]:
    """COLUMNS / LINES that are not a positive whole number: removed (rich would draw 0 columns
    wide); what was dropped, for a warning."""
    dropped = []
    for name in ("COLUMNS", "LINES"):
        value = environ.get(name)
        if value is not None and not (value.strip().isdigit() and int(value) > 0):
            del environ[name]
            dropped.append(f"{name}={value!r} is not a positive number; ignored")
    return dropped


TERMINAL_WARNINGS = drop_bad_terminal_size()
err_console = SafeConsole(stderr=True, highlight=False)


def print_json(data: dict[str, Any]) -> None:
    """--json output: plain stdout write, never through rich (pdm's pitfall). json.dumps
    escapes every control character (ESC is \\u001b)."""
    sys.stdout.write(json.dumps(data, sort_keys=True) + "\n")
    sys.stdout.flush()
