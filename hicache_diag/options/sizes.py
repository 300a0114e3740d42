"""Byte sizes as users write them (`64MiB`): one parser for every command and both engines."""

from __future__ import annotations

import re

from hicache_diag.errors import UsageError

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KiB|MiB|GiB|KB|MB|GB|K|M|G)?\s*$", re.IGNORECASE)
_KIB = 1024
_UNITS = {
    "b": 1,
    **dict.fromkeys(("k", "kib", "kb"), _KIB),
    **dict.fromkeys(("m", "mib", "mb"), _KIB**2),
    **dict.fromkeys(("g", "gib", "gb"), _KIB**3),
}


def parse_size(text: str | int) -> int:
    """`64MiB` -> bytes. Accepts B, KiB, MiB, GiB (and K/M/G, KB/MB/GB as binary units)."""
    if isinstance(text, int):
        return text
    m = _SIZE_RE.match(str(text))
    if not m:
        raise UsageError(f"malformed size {text!r}; expected e.g. 512KiB, 64MiB, 1GiB")
    unit = (m.group(2) or "B").lower()
    return int(float(m.group(1)) * _UNITS[unit])
