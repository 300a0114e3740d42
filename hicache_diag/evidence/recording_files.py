"""A production recording's names (evidence/recording.py): its environment, its files, its
bounds and its meta record, spelled once for the writer inside SGLang and every reader.
Standard library only."""

from __future__ import annotations

import json
import os
import socket
import struct
import time
import zlib
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hicache_diag.evidence import files

RECORD_DIR_ENV = "HICACHE_DIAG_RECORD_DIR"  # the env-only form: where sessions go
SESSION_ENV = "HICACHE_DIAG_RECORD_SESSION"  # this launch's folder, set by its first process
SWITCH_ENV = "HICACHE_DIAG_RECORD"  # "0", "off", "false", "no" (any case): recording off
CPU_SHIMS_ENV = "HICACHE_DIAG_RECORD_CPU_SHIMS"  # "1": the plugin's CPU shims (a CPU-only host)
DUMP_REQUEST = "dump-request.json"
MAX_REQUEST_BYTES = 64 << 10
DUMP_SIGNAL = "SIGUSR2"  # SGLang 0.5.12-0.5.23 leaves it alone; SIGUSR1 stays faulthandler's
DIGEST = struct.Struct("<II")  # step, crc32: one written step
OFF_WORDS = frozenset({"0", "off", "false", "no"})
ON_WORDS = frozenset({"", "1", "on", "true", "yes"})
# Why a rank wrote a dump: SGLang's watchdog fired, the consensus checker found a mismatch, the
# scheduler raised, triage asked (dump-request.json), an operator sent DUMP_SIGNAL.
DUMP_REASONS = ("watchdog", "mismatch", "exception", "asked", "signal")


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


def field_texts(line: dict[str, Any], fields_: Iterable[str]) -> list[tuple[str, str]]:
    """(field, its value as canonical JSON) for each must-agree field the line holds: the one
    encoding both digests are taken over (each value encoded once a step)."""
    return [(k, json.dumps(line[k], sort_keys=True)) for k in fields_ if k in line]


def texts_digest(texts: Iterable[tuple[str, str]]) -> int:
    return zlib.crc32(";".join(f"{k}={t}" for k, t in sorted(texts)).encode())


def step_digest(line: dict[str, Any], fields_: Iterable[str]) -> int:
    """crc32 of the must-agree fields a line holds, as canonical JSON: equal lines, equal crc."""
    return texts_digest(field_texts(line, fields_))


def field_digest(step: int, value: Any, crc: int) -> int:
    """A block's running crc of one field, `value` at `step` folded into `crc`."""
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
    dump_signal: str | None = None  # the signal that asks this rank for a dump; None: none
    dumper: bool = False  # a dumper thread answers dump-request.json

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RankMeta:
        """TypeError where a key holds a JSON type its readers cannot use (a damaged file)."""
        known = set(cls.__dataclass_fields__)
        kwargs = {k: v for k, v in data.items() if k in known}
        for key, value in kwargs.items():
            if not isinstance(value, _META_TYPES.get(key, object)):
                raise TypeError(f"rank meta: {key!r} holds {type(value).__name__}")
        if not all(isinstance(f, str) for f in kwargs.get("fields", ())):
            raise TypeError("rank meta: 'fields' holds a name that is not a string")
        return cls(**kwargs)


_NUMBER = (int, float)
_META_TYPES: dict[str, Any] = {
    **dict.fromkeys(("rank", "pp_rank", "tp_rank", "pid"), int),
    **dict.fromkeys(("host", "release", "off_reason", "device", "dump_signal"), (str, type(None))),
    "fields": list,
    "limits": dict,
    "started_at": _NUMBER,
    "off_at": (*_NUMBER, type(None)),
    "last_step": (int, type(None)),
    **dict.fromkeys(("on", "dumper"), bool),
}


def write_private(path: Path, text: str) -> None:
    """Atomic: a temporary file in the same folder (0600), then rename over `path`."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        try:
            data = text.encode()
            while data:
                data = data[os.write(fd, data) :]
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:  # a full disk: the old file stays whole, no temporary is left
        tmp.unlink(missing_ok=True)
        raise


# -- asking every rank of a session for a dump ------------------------------------------------
def write_dump_request(session: Path, request_id: str, now: float | None = None) -> Path:
    """`<session>/dump-request.json` = {"id", "at"}, atomically: each rank's dumper thread
    answers a new id once, with `rank{r}.dump-N.json` holding `"request": id`."""
    body = {"id": str(request_id), "at": time.time() if now is None else now}
    path = session / DUMP_REQUEST
    write_private(path, json.dumps(body, sort_keys=True))
    return path


def read_dump_request(session: Path) -> dict[str, Any] | None:
    """The request as written, or None (absent, torn, or not a request)."""
    try:  # a small file of ours: anything larger, deeper or not regular is not a request
        data = files.loads(files.read_bytes(session / DUMP_REQUEST, MAX_REQUEST_BYTES))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("id"), str):
        return None
    return data
