"""Saved stacks (py-spy JSON, or faulthandler text) -> where each rank's main thread waits."""

from __future__ import annotations

import re
from typing import Any

# Functions of a HiCache protocol wait, ours and SGLang's (sglang-internals §2, §7).
HICACHE_WAIT = (
    "check_hicache_events",
    "writing_check",
    "loading_check",
    "pp_sync",
    "_pp_sync",
    "drain_async_work",
    "check_prefetch_progress",
)
# Where a scheduler step's own code lives (ours and SGLang's): the caller worth naming.
_STEP_DIRS = ("/managers/", "/mem_cache/")
_HELPERS = ("_commit",)  # waits on a list of sends: its caller says which


def _is_step(frame: tuple[str, str, int]) -> bool:
    name = frame[0].rsplit(".", 1)[-1]
    return any(d in frame[1] for d in _STEP_DIRS) and name not in _HELPERS


_FH_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')


def _main_thread(threads: list[dict[str, Any]]) -> dict[str, Any] | None:
    for th in threads:
        if th.get("thread_name") == "MainThread":
            return th
    return threads[0] if threads else None


def _frames_from_json(dump: Any) -> list[tuple[str, str, int]]:
    """Innermost first: (function, file, line)."""
    threads = dump if isinstance(dump, list) else (dump or {}).get("threads", [])
    main = _main_thread([t for t in threads if isinstance(t, dict)])
    if not main:
        return []
    out = []
    for fr in main.get("frames", []):
        filename = fr.get("filename") or fr.get("short_filename") or "?"
        out.append((str(fr.get("name", "?")), filename, int(fr.get("line") or 0)))
    return out


def _text_blocks(text: str) -> list[list[tuple[str, str, int]]]:
    """faulthandler prints one block per thread ("Thread 0x..." or "Current thread 0x..."),
    most recent call first."""
    blocks: list[list[tuple[str, str, int]]] = []
    for line in text.splitlines():
        if line.startswith(("Thread ", "Current thread ")) or not blocks:
            blocks.append([])
        m = _FH_FRAME.match(line)
        if m:
            blocks[-1].append((m["func"], m["file"], int(m["line"])))
    return [b for b in blocks if b]


def _frames_from_text(text: str) -> list[tuple[str, str, int]]:
    """The main thread's frames: the block that starts at `<module>` (other threads start in
    threading's _bootstrap); else the first block."""
    blocks = _text_blocks(text)
    for block in blocks:
        if block[-1][0] == "<module>":
            return block
    return blocks[0] if blocks else []


def main_frames(dump: Any) -> list[tuple[str, str, int]]:
    if isinstance(dump, str):
        return _frames_from_text(dump)
    return _frames_from_json(dump)


def _fmt(frame: tuple[str, str, int]) -> str:
    func, filename, line = frame
    return f"{func} ({filename.rsplit('/', 1)[-1]}:{line})"


def where(dump: Any) -> str | None:
    """The innermost frame of our own code (else the innermost frame) as 'func (file:line)', then
    the scheduler or cache step it serves when that is another frame, e.g. `_recv_bytes
    (parallel_state.py:62) <- recv_requests (scheduler.py:58)`."""
    frames = main_frames(dump)
    if not frames:
        return None
    ours = [f for f in frames if "hicache_diag" in f[1] or "sglang" in f[1]]
    first = (ours or frames)[0]
    step = next((f for f in ours if _is_step(f)), None)
    if step is None or step == first:
        return _fmt(first)
    return f"{_fmt(first)} <- {_fmt(step)}"


def hicache_wait(dump: Any) -> str | None:
    """The HiCache protocol function this rank is blocked under, if any."""
    # py-spy qualifies methods ("HiRadixCache.writing_check"): match the last component.
    names = [f[0].rsplit(".", 1)[-1] for f in main_frames(dump)]
    for name in names:
        if name in HICACHE_WAIT:
            return name
    return None


def is_receiving(dump: Any) -> bool:
    """Blocked in a receive (p2p recv, recv_tensor_dict, point_to_point_pyobj on the recv side)."""
    names = [f[0].rsplit(".", 1)[-1] for f in main_frames(dump)[:6]]
    return any(n in ("recv", "irecv", "_recv_bytes", "recv_object", "recv_tensor_dict")
               for n in names)  # fmt: skip
