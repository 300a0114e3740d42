"""What a launch's own log says while it starts: the start-up phase it is in, why it failed,
and a port it lost (read from the launch's lines only: a warm server's log holds earlier ones)."""

from __future__ import annotations

import re
from pathlib import Path

# Log lines that open each start-up phase (SGLang 0.5.x), latest first.
_PHASES = (
    (
        ("Uvicorn running", "Application startup complete", "The server is fired up"),
        "waiting for /health_generate",
    ),
    (
        ("Memory pool end", "KV Cache is allocated", "Capture cuda graph", "max_total_num_tokens"),
        "allocating the KV cache",
    ),
    (
        ("Load weight begin", "Loading safetensors", "Load weight end", "Init torch distributed"),
        "loading the model",
    ),
)


def startup_phase(log_tail: str) -> str:
    """The phase the server log shows: launching, loading the model, allocating the KV cache,
    waiting for /health_generate."""
    for markers, phase in _PHASES:
        if any(m in log_tail for m in markers):
            return phase
    return "launching"


def log_tail(path: Path, size: int = 64 * 1024) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, fh.seek(0, 2) - size))
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


def last_error_line(log: Path) -> str:
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    # A line logged as an ERROR (uvicorn's failed bind: another process took the port between
    # our pick and SGLang's bind) says why; a traceback SGLang logged as a warning does not.
    for pattern in (_FATAL_LINE, _ERROR_LINE):
        for line in reversed(lines):
            text = line.strip()
            if pattern.search(text) and text != "Traceback (most recent call last):":
                return text[:300]
    return lines[-1][:300] if lines else "(empty log)"


def port_taken_line(log: Path, offset: int) -> str | None:
    """The line of this launch's log (from `offset`) saying a bind found its address in use."""
    try:
        with open(log, "rb") as fh:
            fh.seek(offset)
            text = fh.read().decode(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if _PORT_TAKEN.search(line):
            return line.strip()[:200]
    return None


# A bind that failed (uvicorn's HTTP port), or SGLang's own check of the ports it derives for
# its processes, which gives up after SGLANG_WAIT_PORT_TIMEOUT (0.5.12-0.5.23 `PortArgs.init_new`;
# not its INFO "Port N is already in use, trying port N+1", which moves on by itself).
_PORT_TAKEN = re.compile(r"address already in use|\bPort is already in use\.", re.IGNORECASE)
_FATAL_LINE = re.compile(rf"\bERROR\b|{_PORT_TAKEN.pattern}")  # case kept: not "error:"
_ERROR_LINE = re.compile(r"(Error|Exception|error:|Traceback|Killed|exited)")
