"""PyTorch Flight Recorder dumps read as evidence (`triage --fr DIR`): one file per rank, as
torch writes them on a collective timeout (`TORCH_FR_DUMP_TEMP_FILE<rank>`, NCCL) or as a
program writes `torch._C._distributed_c10d._dump_fr_trace()` (any backend, gloo included):
pickle or JSON, versions 2.x (torch 2.6-2.15).

torch's own components are used where they work: its loader's rule for the dump files' names
(a common prefix, then the rank) and its builder's groups and memberships from `pg_config`.
Around them: a pickle is read by an unpickler that builds plain values only (a dump holds
nothing else; torch's loader would run whatever a file names); an empty `pg_config` (gloo
writes `{"": {"name": "", ...}}`) is rebuilt from the ranks' own map, the process groups their
entries name and their `pg_status`; gloo never marks a collective completed, so its entries'
state is unknown, not `scheduled`; gloo records no point-to-point operation, and the findings
say so rather than infer that none ran."""

from __future__ import annotations

import json
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path

from hicache_diag.errors import UsageError
from hicache_diag.evidence import files

MAX_DUMP_BYTES = 256 * 1024 * 1024
MAX_FILES = 100_000  # one file a rank: past the largest job a dump folder holds
_RANK_AT_END = re.compile(r"([\w\-]*?)(\d+)$")


@dataclass(frozen=True, slots=True)
class FrEntry:
    """One recorded operation of one rank."""

    rank: int  # the global rank whose dump holds it
    group: str  # the process group's name (`0`, `1`, ...)
    desc: str  # its description (`default_pg`, `tp_group`, ...)
    seq: int  # collective_seq_id (p2p_seq_id for a point-to-point op)
    op: str  # `all_reduce`, `barrier`, `send`, ... (the backend prefix off)
    state: str | None  # scheduled | started | completed; None where the backend never says
    is_p2p: bool
    sizes: str  # input sizes, as recorded
    site: str | None  # the innermost frame outside torch: `main (fr2.py:11)`


@dataclass(slots=True)
class FrDump:
    rank: int
    path: Path
    version: str
    backend: str  # nccl | gloo | ... (from the profiling names)
    entries: list[FrEntry]
    members: dict[str, list[int]] = field(default_factory=dict)  # group name -> global ranks
    descs: dict[str, str] = field(default_factory=dict)  # group name -> description
    repairs: list[str] = field(default_factory=list)


class _PlainUnpickler(pickle.Unpickler):
    """A dump holds dicts, lists, strings and figures: any class it names is refused."""

    def find_class(self, module: str, name: str):  # noqa: ANN201 - pickle's signature
        raise pickle.UnpicklingError(f"a Flight Recorder dump names no class ({module}.{name})")


def _load(path: Path) -> dict:
    # Bounded and never blocking (a FIFO, a device), nested no deeper than a dump nests.
    data = files.read_bytes(path, MAX_DUMP_BYTES)
    if data[:1] in (b"{", b"[") or data.lstrip()[:1] == b"{":
        value = files.loads(data)
    else:
        import io

        value = _PlainUnpickler(io.BytesIO(data)).load()
        if files.depth(value) > files.MAX_JSON_DEPTH:
            raise ValueError(f"nested deeper than {files.MAX_JSON_DEPTH} levels")
    if not isinstance(value, dict) or "entries" not in value:
        raise ValueError("no `entries`: not a Flight Recorder dump")
    return value


def _ranks_by_name(names: list[str]) -> dict[str, int]:
    """Each dump file's rank, by torch's loader's rule (a common prefix, then the rank);
    the same rule by hand where torch is not importable."""
    try:
        import logging

        logging.getLogger("Flight Recorder").disabled = True  # its logger prints on import
        from torch.distributed.flight_recorder.components.loader import _determine_prefix

        prefix = _determine_prefix(names)
        return {n: int(n[n.find(prefix) + len(prefix) :]) for n in names if prefix in n}
    except Exception:  # noqa: BLE001 - no torch, or no common prefix: the rank ends the name
        return {n: int(m[2]) for n in names if (m := _RANK_AT_END.search(n))}


def _site(frames: object) -> str | None:
    """The innermost frame outside torch (the caller of the collective)."""
    if not isinstance(frames, list):
        return None
    for f in frames:
        if isinstance(f, dict) and "/torch/" not in str(f.get("filename", "")):
            where = str(f.get("filename", "?")).rsplit("/", 1)[-1]
            return f"{f.get('name')} ({where}:{f.get('line')})"
    return None


def _entry(rank: int, raw: dict, backend: str) -> FrEntry | None:
    pg = raw.get("process_group")
    if not isinstance(pg, (list, tuple)) or len(pg) < 2:
        return None
    name = str(raw.get("profiling_name", ""))
    op = name.split(":", 1)[-1]
    is_p2p = bool(raw.get("is_p2p", op in ("send", "recv", "_send", "_recv")))
    seq = raw.get("p2p_seq_id" if is_p2p else "collective_seq_id", 0)
    state = raw.get("state") if backend != "gloo" else None
    sizes = str(raw.get("input_sizes", ""))
    return FrEntry(
        rank, str(pg[0]), str(pg[1]), int(seq), op, state, is_p2p, sizes, _site(raw.get("frames"))
    )


def _backend(raw_entries: list) -> str:
    names = [str(e.get("profiling_name", "")) for e in raw_entries if isinstance(e, dict)]
    heads = {n.split(":", 1)[0] for n in names if ":" in n}
    return heads.pop() if len(heads) == 1 else ("/".join(sorted(heads)) or "?")


def read_dump(path: Path, rank: int) -> FrDump:
    raw = _load(path)
    entries_raw = [e for e in raw.get("entries", []) if isinstance(e, dict)]
    backend = _backend(entries_raw)
    entries = [e for e in (_entry(rank, r, backend) for r in entries_raw) if e is not None]
    dump = FrDump(rank, path, str(raw.get("version", "?")), backend, entries)
    _groups(dump, raw.get("pg_config"), raw.get("pg_status"))
    return dump


def _groups(dump: FrDump, pg_config: object, pg_status: object) -> None:
    """Members and descriptions of the groups from pg_config (through torch's builder where
    it reads it); an empty one rebuilt from the groups the entries and pg_status name."""
    config = pg_config if isinstance(pg_config, dict) else {}
    usable = {k: v for k, v in config.items() if k and isinstance(v, dict) and v.get("name")}
    for name, cfg in usable.items():
        dump.members[str(name)] = _ranks(cfg.get("ranks"))
        dump.descs[str(name)] = str(cfg.get("desc", ""))
    named = {e.group: e.desc for e in dump.entries}
    named.update({str(k): named.get(str(k), "") for k in (pg_status or {}) if str(k)})
    missing = [g for g in named if g not in dump.members]
    if missing:
        # The only group pg_config lists without a name is the default one; its ranks are
        # the world's.
        world = next((_ranks(v.get("ranks")) for v in config.values() if isinstance(v, dict)), [])
        for g in missing:
            dump.members[g] = world if named[g] == "default_pg" or len(missing) == 1 else []
            dump.descs[g] = named[g]
        dump.repairs.append(
            f"rank {dump.rank}: pg_config names no group ({dump.backend} leaves it empty); "
            f"rebuilt from the ranks' own map: {', '.join(f'{g} ({named[g]})' for g in missing)}"
        )


def _ranks(value: object) -> list[int]:
    """pg_config's `ranks` (a list, or its text `'[0, 1]'`), through torch's builder's own
    reading when torch is there."""
    if isinstance(value, list):
        return [int(r) for r in value]
    try:
        parsed = json.loads(str(value))
    except ValueError:
        return []
    return [int(r) for r in parsed] if isinstance(parsed, list) else []


def _dump_files(folder: Path) -> list[Path]:
    """The folder's regular files (a FIFO or a device is no dump), at most MAX_FILES."""
    found = []
    for p in folder.iterdir():
        if p.is_file():
            found.append(p)
        if len(found) > MAX_FILES:
            raise UsageError(
                f"--fr {folder}: more than {MAX_FILES} files; give the folder of one job's dumps"
            )
    return sorted(found)


def read_flight_dir(folder: Path) -> list[FrDump]:
    """Every rank's dump in `folder`; UsageError when none reads as one."""
    names = _dump_files(folder)
    ranks = _ranks_by_name([p.name for p in names])
    dumps, bad = [], []
    for p in names:
        if p.name not in ranks:
            continue
        try:
            dumps.append(read_dump(p, ranks[p.name]))
        except (
            OSError,
            ValueError,
            pickle.UnpicklingError,
            EOFError,
            TypeError,
            RecursionError,
            MemoryError,
        ) as exc:
            bad.append(f"{p.name}: {exc}")
    if not dumps:
        why = f" ({bad[0]})" if bad else " (a dump file's name ends with its rank)"
        raise UsageError(f"--fr {folder}: no Flight Recorder dump read{why}")
    return sorted(dumps, key=lambda d: d.rank)
