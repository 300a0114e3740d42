"""A run directory's files as the tool writes and reads them, whoever made them.

Written atomically: a temporary file in the same folder, flushed and fsynced, then renamed over
the name, so a reader (a `report` of a run still going, a run killed, a full disk) sees the old
file or the new one, never half of one; a failed write leaves no temporary behind.

Read as hostile input (a run dir may be copied from anywhere, or damaged): only regular files
(a FIFO or a device would block or never end: opened without blocking, then refused), at most a
bounded number of bytes, JSON nested no deeper than any writer of ours nests it. Every refusal is
a ValueError saying why, which the readers word as damage. Standard library only (the SGLang
plugin's bundle imports the evidence package).
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from hicache_diag.evidence.paths import kind_of

MIB = 1 << 20
# The largest side file (manifest, launcher, outputs, stacks...) read whole: outputs.json of a
# few thousand requests is a few MiB.
MAX_JSON_BYTES = 64 * MIB
# A rank's step file: a day at one step a millisecond is ~100 MiB of lines.
MAX_STEPS_BYTES = 512 * MIB
# A log is read from its end (where a crash is) when it is longer than this.
MAX_TEXT_BYTES = 64 * MIB
# py-spy's JSON nests 5 deep, our records 4; nothing of ours goes past 20.
MAX_JSON_DEPTH = 64


class Unreadable(ValueError):
    """A file that is there but cannot be read as evidence (not regular, too large, too deep)."""


def read_bytes(path: Path | str, limit: int = MAX_JSON_BYTES, tail: bool = False) -> bytes:
    """The file's bytes: a regular file only (opened without blocking, so a FIFO never waits
    for a writer), at most `limit` of them: past it, Unreadable, or with `tail` its last
    `limit` bytes. OSError (missing, a symlink loop, a name too long) is the caller's."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise Unreadable(f"it is {kind_of(mode)}, not a regular file")
        size = os.fstat(fd).st_size
        if size > limit:
            if not tail:
                raise Unreadable(f"it is larger than {limit // MIB} MiB ({size} bytes)")
            os.lseek(fd, size - limit, os.SEEK_SET)
        with os.fdopen(os.dup(fd), "rb") as fh:
            data = fh.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:  # it grew while read
        if not tail:
            raise Unreadable(f"it is larger than {limit // MIB} MiB")
        data = data[-limit:]
    return data


def read_text(path: Path | str, limit: int = MAX_TEXT_BYTES, tail: bool = True) -> str:
    """A text file (a log), undecodable bytes replaced; by default its last `limit` bytes."""
    return read_bytes(path, limit, tail).decode("utf-8", errors="replace")


def loads(text: str | bytes) -> Any:
    """json.loads, with nesting past MAX_JSON_DEPTH refused (Unreadable) instead of a
    RecursionError here or in whatever walks the value later."""
    if _brackets(text) > MAX_JSON_DEPTH:
        try:
            value = json.loads(text)
        except RecursionError:
            raise Unreadable(f"its JSON is nested deeper than {MAX_JSON_DEPTH} levels") from None
        if depth(value) > MAX_JSON_DEPTH:
            raise Unreadable(f"its JSON is nested deeper than {MAX_JSON_DEPTH} levels")
        return value
    return json.loads(text)


def _brackets(text: str | bytes) -> int:
    """An upper bound on the nesting (cheap: most lines hold a few brackets)."""
    if isinstance(text, bytes):
        return text.count(b"[") + text.count(b"{")
    return text.count("[") + text.count("{")


def depth(value: Any) -> int:
    """How deep `value` nests (a scalar: 0), walked without recursion. A container reached
    again (an unpickled value may share one, or hold itself) is walked again only from a
    deeper level: at most MAX_JSON_DEPTH walks of each."""
    deepest, todo, seen = 0, [(value, 1)], {}
    while todo:
        item, level = todo.pop()
        if isinstance(item, dict):
            children = list(item.values())
        elif isinstance(item, (list, tuple)):  # a tuple: an unpickled value's
            children = item
        else:
            continue
        if seen.get(id(item), 0) >= level:
            continue
        seen[id(item)] = level
        deepest = max(deepest, level)
        if level > MAX_JSON_DEPTH:
            return level
        todo.extend((v, level + 1) for v in children)
    return deepest


def read_json(path: Path | str, limit: int = MAX_JSON_BYTES) -> Any:
    """A JSON file, bounded (see read_bytes and loads)."""
    return loads(read_bytes(path, limit).decode("utf-8", errors="replace"))


def write_atomic(path: Path | str, data: str | bytes, sync: bool = True) -> Path:
    """Write `data` to `path` through a temporary file in its folder, fsynced (`sync`), then
    os.replace: a symlink at `path` is replaced, never followed. A failure (a full disk, EIO)
    raises with the old file whole and no temporary left."""
    path = Path(path)
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:200]}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            fh.flush()
            if sync:
                os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; a plain file would be 0644
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _umask()
