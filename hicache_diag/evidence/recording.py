"""A production recording (`hicache-diag record`): what each rank of a server the user launched
keeps on disk for the server's whole life, bounded, and how triage reads it back. Standard
library only: the plugin writes it inside SGLang's scheduler processes.

One folder per launch (a session), under the record dir:

    <dir>/<host>-<utc>-<pid>/          the launch's first process names it (SESSION_ENV)
      rank{r}.meta.json                who the rank is, what it records, on or off and why
      rank{r}.jsonl, rank{r}.jsonl.1   full step lines (run's rank{r}.jsonl lines), a ring of two
      rank{r}.digest.NNNNNN            8 bytes a written step: (step, crc32 of its must-agree
                                       fields), in segments; the oldest dropped past the cap
      rank{r}.blocks.jsonl[.1]         per block of BLOCK_STEPS steps, one crc per field: which
                                       field parted the ranks once the full lines rotated out
      rank{r}.dump-N.json              in-process snapshots (watchdog, mismatch, exception, asked)
      dump-request.json                written by triage: every rank answers with a dump

A writer never raises: any OSError (a full disk, a read-only dir) or a disk near full turns the
rank's recording off, says why in its meta file (when it still can) and through `on_off`, once.
Files are 0600, folders 0700: a recording may hold request shapes of a production server.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

RECORD_DIR_ENV = "HICACHE_DIAG_RECORD_DIR"  # the env-only form: where sessions go
SESSION_ENV = "HICACHE_DIAG_RECORD_SESSION"  # this launch's folder, set by its first process
SWITCH_ENV = "HICACHE_DIAG_RECORD"  # "0", "off", "false", "no" (any case): recording off
DUMP_REQUEST = "dump-request.json"
DIGEST = struct.Struct("<II")  # step, crc32: one written step
OFF_WORDS = frozenset({"0", "off", "false", "no"})
ON_WORDS = frozenset({"", "1", "on", "true", "yes"})


@dataclass(frozen=True, slots=True)
class Limits:
    """The recorder's bounds per rank. Defaults: 2 x 4 MiB of full lines, 8 x 4 MiB of step
    digests (4M written steps), 2 x 4 MiB of block digests, the last 8 dumps, and off when
    the disk's free space falls under `reserve_bytes`."""

    lines_bytes: int = 4 << 20
    digest_segment_bytes: int = 4 << 20
    digest_segments: int = 8
    block_steps: int = 256
    blocks_bytes: int = 4 << 20
    dumps_kept: int = 8
    reserve_bytes: int = 256 << 20


def switch_state(value: str | None) -> bool | None:
    """The switch's reading: True on, False off, None a value that is neither (refused by the
    CLI, treated as on by the plugin, which must never guess a user's server off)."""
    word = (value or "").strip().lower()
    if word in OFF_WORDS:
        return False
    if word in ON_WORDS:
        return True
    return None


def session_name(pid: int, now: float | None = None, host: str | None = None) -> str:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now if now is not None else time.time()))
    return f"{host or socket.gethostname()}-{stamp}-{pid}"


def meta_path(session: Path, rank: int) -> Path:
    return session / f"rank{rank}.meta.json"


def lines_path(session: Path, rank: int, older: bool = False) -> Path:
    return session / (f"rank{rank}.jsonl.1" if older else f"rank{rank}.jsonl")


def blocks_path(session: Path, rank: int, older: bool = False) -> Path:
    return session / (f"rank{rank}.blocks.jsonl.1" if older else f"rank{rank}.blocks.jsonl")


def digest_path(session: Path, rank: int, segment: int) -> Path:
    return session / f"rank{rank}.digest.{segment:06d}"


def dump_path(session: Path, rank: int, n: int) -> Path:
    return session / f"rank{rank}.dump-{n}.json"


def step_digest(line: dict[str, Any], fields_: Iterable[str]) -> int:
    """crc32 of the must-agree fields a line holds, as canonical JSON: equal lines, equal crc."""
    held = {k: line[k] for k in fields_ if k in line}
    return zlib.crc32(json.dumps(held, sort_keys=True, separators=(",", ":")).encode())


def field_digest(step: int, value: Any, crc: int) -> int:
    return zlib.crc32(f"{step}:{json.dumps(value, sort_keys=True)}".encode(), crc)


@dataclass(slots=True)
class RankMeta:
    """rank{r}.meta.json: the rank, its process, what it records and whether it still does."""

    rank: int
    pp_rank: int
    tp_rank: int
    pid: int
    host: str
    release: str | None
    fields: list[str]
    started_at: float
    limits: dict[str, int]
    on: bool = True
    off_reason: str | None = None
    off_at: float | None = None
    last_step: int | None = None  # the last step written when the meta was last written
    device: str | None = None  # cpu / cuda: what the scheduler's tensors live on

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RankMeta:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


def _write_private(path: Path, text: str) -> None:
    """Atomic: a temporary file in the same folder (0600), then rename over `path`."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _append_fd(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)


@dataclass(slots=True)
class _Block:
    index: int
    first: int
    last: int = 0
    n: int = 0
    crcs: dict[str, int] = field(default_factory=dict)

    def line(self) -> str:
        data = {"block": self.index, "first": self.first, "last": self.last, "n": self.n}
        return json.dumps({**data, "f": self.crcs}, sort_keys=True) + "\n"


class RankRecording:
    """One rank's writer. `write_step(line)` after each step the recorder writes; `dump(doc,
    reason)` for a snapshot; `close()` at exit. Called from the scheduler thread, except
    `dump`, which a dumper thread may call (its own files only)."""

    def __init__(
        self,
        session: Path,
        meta: RankMeta,
        limits: Limits = Limits(),
        on_off: Callable[[str], None] | None = None,
    ) -> None:
        self.session, self.meta, self.limits, self._on_off = session, meta, limits, on_off
        self._fds: dict[str, int] = {}
        self._sizes: dict[str, int] = {}
        self._segment = 0
        self._block: _Block | None = None
        self._dumps = 0
        self._guard(self._start)

    @property
    def on(self) -> bool:
        return self.meta.on

    # -- the writer's steps -------------------------------------------------------------------
    def _start(self) -> None:
        self.session.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._check_free()
        _write_private(meta_path(self.session, self.meta.rank), json.dumps(self.meta.to_json()))

    def write_step(self, line: dict[str, Any]) -> None:
        if self.meta.on:
            self._guard(self._write_step, line)

    def _write_step(self, line: dict[str, Any]) -> None:
        step = int(line.get("step", 0))
        self._append("lines", (json.dumps(line, sort_keys=True) + "\n").encode())
        crc = step_digest(line, self.meta.fields)
        self._append("digest", DIGEST.pack(step & 0xFFFFFFFF, crc))
        self._fold_block(step, line)
        self.meta.last_step = step

    def _fold_block(self, step: int, line: dict[str, Any]) -> None:
        index = step // self.limits.block_steps
        if self._block is not None and self._block.index != index:
            self._flush_block()
        if self._block is None:
            self._block = _Block(index, step)
        block = self._block
        block.last, block.n = step, block.n + 1
        for key in self.meta.fields:
            if key in line:
                block.crcs[key] = field_digest(step, line[key], block.crcs.get(key, 0))

    def _flush_block(self) -> None:
        if self._block is not None:
            self._append("blocks", self._block.line().encode())
            self._block = None

    def dump(self, doc: dict[str, Any], reason: str) -> Path | None:
        """A snapshot file (the last `dumps_kept` stay); its path, None when off or failed."""
        if not self.meta.on:
            return None
        return self._guard(self._dump, doc, reason)

    def _dump(self, doc: dict[str, Any], reason: str) -> Path:
        self._check_free()
        self._dumps += 1
        path = dump_path(self.session, self.meta.rank, self._dumps)
        body = {"rank": self.meta.rank, "reason": reason, "at": time.time(), **doc}
        _write_private(path, json.dumps(body, sort_keys=True, default=str))
        old = dump_path(self.session, self.meta.rank, self._dumps - self.limits.dumps_kept)
        old.unlink(missing_ok=True)
        return path

    def close(self) -> None:
        if self.meta.on:
            self._guard(self._flush_block)
            self._guard(self._write_meta)
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def _write_meta(self) -> None:
        _write_private(meta_path(self.session, self.meta.rank), json.dumps(self.meta.to_json()))

    # -- files, rotation, and turning off ----------------------------------------------------
    def _path(self, kind: str, older: bool = False) -> Path:
        r = self.meta.rank
        if kind == "digest":
            return digest_path(self.session, r, self._segment)
        return (lines_path if kind == "lines" else blocks_path)(self.session, r, older)

    def _cap(self, kind: str) -> int:
        limits = self.limits
        return {
            "lines": limits.lines_bytes,
            "blocks": limits.blocks_bytes,
            "digest": limits.digest_segment_bytes,
        }[kind]

    def _append(self, kind: str, data: bytes) -> None:
        if kind in self._fds and self._sizes[kind] + len(data) > self._cap(kind):
            self._rotate(kind)
        if kind not in self._fds:
            self._check_free()
            path = self._path(kind)
            self._fds[kind] = _append_fd(path)
            self._sizes[kind] = path.stat().st_size
        written = os.write(self._fds[kind], data)
        if written != len(data):
            raise OSError(28, "short write")
        self._sizes[kind] += written

    def _rotate(self, kind: str) -> None:
        os.close(self._fds.pop(kind))
        if kind == "digest":
            self._segment += 1
            drop = self._segment - self.limits.digest_segments
            if drop >= 0:
                digest_path(self.session, self.meta.rank, drop).unlink(missing_ok=True)
        else:
            os.replace(self._path(kind), self._path(kind, older=True))

    def _check_free(self) -> None:
        free = shutil.disk_usage(self.session).free
        if free < self.limits.reserve_bytes:
            raise OSError(28, f"disk nearly full ({free >> 20} MiB free)")

    def _guard(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 - never the server's problem
            self._turn_off(f"{type(exc).__name__}: {exc}")
            return None

    def _turn_off(self, reason: str) -> None:
        if not self.meta.on:
            return
        self.meta.on, self.meta.off_reason, self.meta.off_at = False, reason, time.time()
        for fd in self._fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds.clear()
        try:
            self._write_meta()
        except Exception:  # noqa: BLE001 - a full disk may refuse even this
            pass
        if self._on_off is not None:
            self._on_off(reason)


# -- reading a session back ------------------------------------------------------------------
@dataclass(slots=True)
class RecordedRank:
    """What one rank's recording holds, as read back (a file cut mid-record is read up to it)."""

    rank: int
    meta: RankMeta | None
    digests: list[tuple[int, int]]  # (step, crc), oldest first
    blocks: list[dict[str, Any]]
    lines: list[dict[str, Any]]  # full step lines still held, oldest first
    dumps: list[dict[str, Any]]  # oldest first

    @property
    def last_step(self) -> int | None:
        steps = [s for s, _ in self.digests[-1:]] + [ln.get("step") for ln in self.lines[-1:]]
        known = [s for s in steps if isinstance(s, int)]
        return max(known) if known else (self.meta.last_step if self.meta else None)


def _json_lines(paths: Iterable[Path]) -> list[dict[str, Any]]:
    out = []
    for path in paths:
        if not path.is_file():
            continue
        for raw in path.read_bytes().splitlines():
            try:
                item = json.loads(raw)
            except ValueError:
                continue  # a line cut by a crash or a full disk
            if isinstance(item, dict):
                out.append(item)
    return out


def _digests(session: Path, rank: int) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for path in sorted(session.glob(f"rank{rank}.digest.*")):
        data = path.read_bytes()
        usable = len(data) - len(data) % DIGEST.size
        out += [DIGEST.unpack_from(data, i) for i in range(0, usable, DIGEST.size)]
    return out


def ranks_in(session: Path) -> list[int]:
    found = set()
    for path in session.glob("rank*.*"):
        head = path.name.split(".", 1)[0].removeprefix("rank")
        if head.isdigit():
            found.add(int(head))
    return sorted(found)


def read_rank(session: Path, rank: int) -> RecordedRank:
    meta = None
    if meta_path(session, rank).is_file():
        try:
            meta = RankMeta.from_json(json.loads(meta_path(session, rank).read_text()))
        except (ValueError, TypeError):
            meta = None
    dumps = []
    for path in session.glob(f"rank{rank}.dump-*.json"):
        try:
            dumps.append(json.loads(path.read_text()))
        except ValueError:
            continue
    dumps.sort(key=lambda d: d.get("at") or 0)
    lines = _json_lines([lines_path(session, rank, older=True), lines_path(session, rank)])
    blocks = _json_lines([blocks_path(session, rank, older=True), blocks_path(session, rank)])
    return RecordedRank(rank, meta, _digests(session, rank), blocks, lines, dumps)


def read_session(session: Path) -> dict[int, RecordedRank]:
    return {r: read_rank(session, r) for r in ranks_in(session)}


def sessions_in(record_dir: Path) -> list[Path]:
    """The sessions under a record dir, newest first (a folder holding rank meta files)."""
    found = [p for p in record_dir.iterdir() if p.is_dir() and any(p.glob("rank*.meta.json"))]
    return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)
