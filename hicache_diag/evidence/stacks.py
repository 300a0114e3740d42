"""Stack dumps as one model: parse py-spy JSON, py-spy text and faulthandler text."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from typing import Any

from hicache_diag.evidence import files
from hicache_diag.evidence.ranks import RankId, parse_rank_tokens, rank_from_title

_PROCESS = re.compile(r"^Process (\d+): (.*)$")
# py-spy's status: `idle`, `active`, `gil`, `active+gil` (the thread holds the GIL).
_THREAD = re.compile(r'^Thread (0x[0-9a-fA-F]+|\d+) \(([\w+]+)\)(?:: "(.*)")?')
# Frames are indented 4 spaces; `--locals` adds deeper "Arguments:" / "name: value" lines.
_PYSPY_FRAME = re.compile(r"^\s{1,6}(\S.*?) \((.+?)(?::(\d+))?\)\s*$")
_FH_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\)")
_FH_FRAME = re.compile(r'^\s+File "(.+?)", line (\d+) in (.+)$')


@dataclass(frozen=True, slots=True)
class Frame:
    name: str
    filename: str
    line: int = 0

    @property
    def short(self) -> str:
        return f"{self.name} ({_short_path(self.filename)})"


@dataclass(frozen=True, slots=True)
class ThreadStack:
    """One thread; `frames[0]` is the innermost frame (where it waits), as py-spy prints."""

    name: str | None
    active: bool | None
    frames: tuple[Frame, ...]
    tid: int | None = None  # OS thread id; the main thread's equals the pid on Linux

    @property
    def signature(self) -> tuple[tuple[str, str, int], ...]:
        return tuple((f.name, f.filename, f.line) for f in self.frames)


@dataclass(slots=True)
class RankDump:
    """One sample of one process. `rank` is None until a title, file name or manifest names it."""

    rank: RankId | None
    pid: int | None
    title: str | None
    threads: list[ThreadStack] = field(default_factory=list)
    source: str = ""
    lineno: int = 0  # where a dump inside a log starts (0: a file of its own, a live sample)

    def main_thread(self) -> ThreadStack | None:
        for thread in self.threads:
            if thread.name == "MainThread":
                return thread
        for thread in self.threads:  # unnamed threads (thread_name null): match tid to pid
            if self.pid is not None and thread.tid == self.pid:
                return thread
        return self.threads[0] if self.threads else None


def _short_path(path: str) -> str:
    for marker in ("site-packages/", "dist-packages/", "/python/"):
        if marker in path:
            return path.rsplit(marker, 1)[1]
    return path


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return None


def threads_from_json(data: list[dict[str, Any]]) -> list[ThreadStack]:
    """`py-spy dump --json`: an array of threads; tolerate missing optional keys, and skip what
    is not a thread or a frame (a damaged or hand-made file is input, never a crash)."""
    threads = []
    for item in data if isinstance(data, list) else []:
        if not isinstance(item, dict):
            continue
        raw = item.get("frames")
        frames = tuple(
            Frame(
                str(f.get("name", "?")),
                str(f.get("filename") or f.get("short_filename") or "?"),
                _int(f.get("line")) or 0,
            )
            for f in (raw if isinstance(raw, list) else [])
            if isinstance(f, dict)
        )
        tid = item.get("os_thread_id")
        name = item.get("thread_name")
        threads.append(
            ThreadStack(
                name if isinstance(name, str) else None, item.get("active"), frames, _int(tid)
            )
        )
    return threads


def dump_from_json(data: Any, source: str) -> RankDump | None:
    """A JSON file: a py-spy thread list, or our envelope `{pid, title, threads}`."""
    if isinstance(data, dict) and isinstance(data.get("threads"), list):
        title = data.get("title") if isinstance(data.get("title"), str) else None
        rank = rank_from_title(title) or parse_rank_tokens(str(data.get("rank") or ""))
        if rank is not None and data.get("node"):  # a multi-node bundle (hicache_diag/cluster)
            rank = replace(rank, node=str(data["node"]))
        return RankDump(
            rank, _int(data.get("pid")), title, threads_from_json(data["threads"]), source
        )
    if isinstance(data, list) and data and all(isinstance(t, dict) and "frames" in t for t in data):
        pid = _int(data[0].get("pid")) if data else None
        return RankDump(None, pid, None, threads_from_json(data), source)
    return None


def parse_pyspy_text(lines: list[str], source: str) -> list[RankDump]:
    """py-spy text (`Process N: title`, `Thread N (idle): "Name"`, indented frames); one dump per
    `Process` header, or one for a headerless block."""
    dumps: list[RankDump] = []
    current: RankDump | None = None
    thread: tuple[str | None, bool | None, list[Frame], int | None] | None = None

    def close_thread() -> None:
        nonlocal thread
        if current is not None and thread is not None:
            name, active, frames, tid = thread
            current.threads.append(ThreadStack(name, active, tuple(frames), tid))
        thread = None

    for raw in lines:
        line = raw.rstrip("\n")
        if m := _PROCESS.match(line.strip()):
            close_thread()
            title = m.group(2).strip()
            current = RankDump(rank_from_title(title), int(m.group(1)), title, [], source)
            dumps.append(current)
        elif m := _THREAD.match(line.strip()):
            close_thread()
            if current is None:
                current = RankDump(None, None, None, [], source)
                dumps.append(current)
            tid = int(m.group(1), 16) if m.group(1).startswith("0x") else int(m.group(1))
            status = m.group(2).split("+")
            thread = (m.group(3), "active" in status or "gil" in status, [], tid)
        elif thread is not None and (m := _PYSPY_FRAME.match(line)):
            thread[2].append(Frame(m.group(1), m.group(2), int(m.group(3) or 0)))
    close_thread()
    return [d for d in dumps if d.threads]


# A paste that kept only a thread's frames (`all_reduce (torch/distributed/...py:3075)`), often
# re-indented by hand: one thread, innermost first, as py-spy printed it.
_BARE_FRAME = re.compile(r"^\s{0,8}([\w<>.]+) \(([^()\s]+?):(\d+)\)\s*$")


def parse_bare_frames(lines: list[str], source: str) -> RankDump | None:
    """Frames with no `Thread` header; None unless every non-blank line is such a frame."""
    frames = []
    for line in lines:
        if not line.strip():
            continue
        m = _BARE_FRAME.match(line)
        if not m:
            return None
        frames.append(Frame(m.group(1), m.group(2), int(m.group(3))))
    if len(frames) < 2:
        return None
    return RankDump(None, None, None, [ThreadStack(None, None, tuple(frames))], source)


def parse_faulthandler(lines: list[str], source: str) -> RankDump | None:
    """faulthandler's `Thread 0x... (most recent call first):` blocks (the no-ptrace fallback)."""
    dump = RankDump(None, None, None, [], source)
    frames: list[Frame] | None = None
    name: str | None = None
    for line in lines:
        if m := _FH_THREAD.match(line.strip()):
            if frames is not None:
                dump.threads.append(ThreadStack(name, None, tuple(frames)))
            frames, name = [], "MainThread" if line.strip().startswith("Current") else None
        elif frames is not None and (m := _FH_FRAME.match(line)):
            frames.append(Frame(m.group(3).strip(), m.group(1), int(m.group(2))))
    if frames is not None:
        dump.threads.append(ThreadStack(name, None, tuple(frames)))
    dump.threads = _name_main_thread(dump.threads)
    return dump if dump.threads else None


# The outermost frame of a program's main thread (a script, or `python -m` through runpy);
# other threads start in threading's `_bootstrap`.
_ENTRY_FRAMES = frozenset({"<module>", "_run_module_as_main"})


def _name_main_thread(threads: list[ThreadStack]) -> list[ThreadStack]:
    """faulthandler names no thread, and its `Current thread` is whichever thread took the
    signal (SIGUSR1 may land on the DMA thread): the main thread is the one that starts at the
    program's entry. Without such a block the `Current thread` guess stands."""
    entry = next((t for t in threads if t.frames and t.frames[-1].name in _ENTRY_FRAMES), None)
    if entry is None:
        return threads
    return [replace(t, name="MainThread" if t is entry else None) for t in threads]


def parse_dump_text(text: str, source: str) -> list[RankDump]:
    """Any stack text we know: JSON, py-spy text or faulthandler."""
    stripped = text.lstrip()
    if stripped.startswith(("[", "{")):
        try:
            docs = [files.loads(stripped)]
        except files.Unreadable:
            return []  # nested past any dump's depth: no stack to read
        except json.JSONDecodeError:
            docs = _json_lines(stripped)  # one dump per line (JSON Lines)
        dumps = [dump_from_json(doc, source) for doc in docs]
        return [d for d in dumps if d is not None and d.threads]
    lines = text.splitlines()
    dumps = parse_pyspy_text(lines, source)
    if dumps:
        return dumps
    fh = parse_faulthandler(lines, source) or parse_bare_frames(lines, source)
    return [fh] if fh else []


def _json_lines(text: str) -> list[Any]:
    docs = []
    for line in text.splitlines():
        try:
            docs.append(files.loads(line))
        except ValueError:
            continue
    return docs
