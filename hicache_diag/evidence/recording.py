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
      rank{r}.dump-N.json              in-process snapshots (DumpSnapshot): watchdog, mismatch,
                                       exception, asked (dump-request.json), signal (SIGUSR2)
      dump-request.json                written by triage: {"id", "at"}; each rank answers a new
                                       id once, with a dump whose "request" is that id

A writer never raises: any OSError (a full disk, a read-only dir) or a disk near full turns the
rank's recording off, says why in its meta file (when it still can) and through `on_off`, once.
Files are 0600, folders 0700: a recording may hold request shapes of a production server.
The names live in recording_files.py, the dump records in recording_dump.py and the reader in
recording_read.py; every one of them is reachable here as `recording.X`.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The recording's names, records and reader, all reachable as `recording.X` (one import for
# the writer inside SGLang and for triage).
from hicache_diag.evidence.recording_dump import DumpSnapshot, ThreadDump
from hicache_diag.evidence.recording_files import (
    CPU_SHIMS_ENV,
    DIGEST,
    DUMP_REASONS,
    DUMP_REQUEST,
    DUMP_SIGNAL,
    OFF_WORDS,
    ON_WORDS,
    RECORD_DIR_ENV,
    SESSION_ENV,
    SWITCH_ENV,
    Limits,
    RankMeta,
    blocks_path,
    digest_path,
    dump_path,
    field_digest,
    field_texts,
    lines_path,
    meta_path,
    read_dump_request,
    session_name,
    step_digest,
    switch_state,
    texts_digest,
    write_dump_request,
    write_private,
)
from hicache_diag.evidence.recording_read import (
    RecordedRank,
    ranks_in,
    read_rank,
    read_session,
    sessions_in,
)

__all__ = [
    "CPU_SHIMS_ENV",
    "DIGEST",
    "DUMP_REASONS",
    "DUMP_REQUEST",
    "DUMP_SIGNAL",
    "OFF_WORDS",
    "ON_WORDS",
    "RECORD_DIR_ENV",
    "SESSION_ENV",
    "SWITCH_ENV",
    "DumpSnapshot",
    "Limits",
    "RankMeta",
    "RankRecording",
    "RecordedRank",
    "ThreadDump",
    "blocks_path",
    "digest_path",
    "dump_path",
    "field_digest",
    "field_texts",
    "lines_path",
    "meta_path",
    "ranks_in",
    "read_dump_request",
    "read_rank",
    "read_session",
    "session_name",
    "sessions_in",
    "step_digest",
    "switch_state",
    "texts_digest",
    "write_dump_request",
]


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
    reason)` for a snapshot; `close()` at exit; `turn_off(reason)` when the recorder itself
    failed. Any thread may call them (the plugin's writer and dumper threads do): one lock, so
    a file descriptor is never closed under a write that another thread is making."""

    def __init__(
        self,
        session: Path,
        meta: RankMeta,
        limits: Limits | None = None,
        on_off: Callable[[str], None] | None = None,
    ) -> None:
        self.session, self.meta, self._on_off = session, meta, on_off
        self.limits = limits or Limits()
        self._fds: dict[str, int] = {}
        self._sizes: dict[str, int] = {}
        self._segment = 0
        self._block: _Block | None = None
        self._dumps = 0
        self._lock = threading.RLock()
        self._guard(self._start)

    @property
    def on(self) -> bool:
        return self.meta.on

    # -- the writer's steps -------------------------------------------------------------------
    def _start(self) -> None:
        self.session.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._check_free()
        self._write_meta()

    def write_step(self, line: dict[str, Any], text: str | None = None) -> None:
        """One step line; `text`: the line as already rendered (the run's StepRecord.line)."""
        self.write_steps([(line, text)])

    def write_steps(self, items: list[tuple[dict[str, Any], str | None]]) -> None:
        """Several step lines at once: one write a file for all of them."""
        if self.meta.on and items:
            with self._lock:
                self._guard(self._write_steps, items)

    def _write_steps(self, items: list[tuple[dict[str, Any], str | None]]) -> None:
        lines, digests = [], []
        for line, text in items:
            step = int(line.get("step", 0))
            lines.append(json.dumps(line, sort_keys=True) if text is None else text)
            texts = field_texts(line, self.meta.fields)
            digests.append(DIGEST.pack(step & 0xFFFFFFFF, texts_digest(texts)))
            self._fold_block(step, texts)
            self.meta.last_step = step
        self._append("lines", ("\n".join(lines) + "\n").encode())
        self._append("digest", b"".join(digests))

    def _fold_block(self, step: int, texts: list[tuple[str, str]]) -> None:
        index = step // self.limits.block_steps
        if self._block is not None and self._block.index != index:
            self._flush_block()
        if self._block is None:
            self._block = _Block(index, step)
        block = self._block
        block.last, block.n = step, block.n + 1
        for key, text in texts:  # field_digest, with the value encoded once
            block.crcs[key] = zlib.crc32(f"{step}:{text}".encode(), block.crcs.get(key, 0))

    def _flush_block(self) -> None:
        if self._block is not None:
            self._append("blocks", self._block.line().encode())
            self._block = None

    def dump(self, doc: dict[str, Any], reason: str) -> Path | None:
        """A snapshot file (the last `dumps_kept` stay); its path, None when off or failed."""
        if not self.meta.on:
            return None
        with self._lock:
            return self._guard(self._dump, doc, reason)

    def _dump(self, doc: dict[str, Any], reason: str) -> Path:
        self._check_free()
        self._dumps += 1
        path = dump_path(self.session, self.meta.rank, self._dumps)
        body = {"rank": self.meta.rank, "reason": reason, "at": time.time(), **doc}
        write_private(path, json.dumps(body, sort_keys=True, default=str))
        old = dump_path(self.session, self.meta.rank, self._dumps - self.limits.dumps_kept)
        old.unlink(missing_ok=True)
        self._write_meta()  # its last_step, as of the dump
        return path

    def close(self) -> None:
        with self._lock:
            if self.meta.on:
                self._guard(self._flush_block)
                self._guard(self._write_meta)
            self._close_fds()

    def refresh_meta(self) -> None:
        """The meta file as the meta now is (a field set after the start)."""
        if self.meta.on:
            with self._lock:
                self._guard(self._write_meta)

    def turn_off(self, reason: str) -> None:
        """The recorder failed (not the disk): off, said once, as for a disk error."""
        with self._lock:
            self._turn_off(reason)

    def _write_meta(self) -> None:
        write_private(meta_path(self.session, self.meta.rank), json.dumps(self.meta.to_json()))

    def _close_fds(self) -> None:
        for fd in self._fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds.clear()

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
            raise OSError(28, "No space left on device (a short write)")
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
        # The reserve is capped at a tenth of the disk: a small volume of its own holds a
        # recording (48 MiB a rank at the default limits) with no system beside it to starve.
        usage = shutil.disk_usage(self.session)
        if usage.free < min(self.limits.reserve_bytes, usage.total // 10):
            raise OSError(28, f"disk nearly full ({usage.free >> 20} MiB free)")

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
        self._close_fds()
        try:
            self._write_meta()
        except Exception:  # noqa: BLE001 - a full disk may refuse even this
            pass
        if self._on_off is not None:
            self._on_off(reason)
