"""Gather stack samples: live from pids (py-spy, several samples), or from a dump directory."""

from __future__ import annotations

import json
import os
import re
import time
from datetime import datetime, timezone
from pathlib import Path

import psutil

from hicache_diag import evidence as ev
from hicache_diag.errors import UsageError
from hicache_diag.evidence import files as ev_files
from hicache_diag.evidence.ranks import RankId, parse_rank_tokens, rank_from_title
from hicache_diag.evidence.stacks import RankDump, parse_dump_text, threads_from_json
from hicache_diag.logs.files import NotALog, decode_text
from hicache_diag.rules.rank_fate import RankFate
from hicache_diag.triage.discover import describe_pid
from hicache_diag.triage.hang import RankSamples
from hicache_diag.triage.pyspy import dump_stacks
from hicache_diag.triage.saved_failures import failure_samples

_SAMPLE = re.compile(r"_s(\d+)\b")
MAX_DUMP_FILES = 10_000  # a dumps folder of one incident: a sample per rank per few seconds
_GLOBAL_RANK = re.compile(r"rank[_-]?(\d+)", re.I)


def _describe(pids: list[int]) -> list[RankSamples]:
    """Title and rank per pid; processes whose title names no rank are numbered TP0..n in order."""
    out: list[RankSamples] = []
    unnamed = 0
    for pid in pids:
        try:
            proc = describe_pid(pid)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            rank, unnamed = RankId(anon=unnamed), unnamed + 1
            out.append(RankSamples(rank, pid, None, error=f"no such process: {pid}"))
            continue
        except psutil.AccessDenied:
            proc = None
        title = proc.title if proc else None
        rank = rank_from_title(title)
        if rank is None:
            rank, unnamed = RankId(anon=unnamed), unnamed + 1
        out.append(RankSamples(rank, pid, title))
    return _dedupe(out)


def _dedupe(ranks: list[RankSamples]) -> list[RankSamples]:
    """Two processes claiming one rank (two clusters on one host) would merge; renumber them."""
    seen: set[RankId] = set()
    for i, rs in enumerate(ranks):
        if rs.rank in seen:
            rs.rank = RankId(pp=rs.rank.pp, tp=1000 + i)
        seen.add(rs.rank)
    return ranks


def capture_live(
    pids: list[int],
    *,
    samples: int = 2,
    interval: float = 0.5,
    deadline_s: float = 5.0,
    native: bool = False,
) -> list[RankSamples]:
    """`samples` parallel py-spy passes `interval` apart; never signals the targets."""
    ranks = _describe(pids)
    live = {rs.pid: rs for rs in ranks if rs.error is None and rs.pid is not None}
    cpu0, t0 = _cpu_seconds(live), time.monotonic()
    for n in range(samples):
        if n:
            time.sleep(interval)
        _sample(live, deadline_s, False, f"sample {n}")
    if samples > 1:
        cpu1, wall = _cpu_seconds(live), max(time.monotonic() - t0, 1e-3)
        for pid, rs in live.items():
            if pid in cpu0 and pid in cpu1:
                rs.cpu_fraction = round((cpu1[pid] - cpu0[pid]) / wall, 3)
    if native:
        # A separate pass: native frames would make every stack look changed between samples.
        _sample(live, deadline_s, True, "native")
    _kernel_states(live)
    return ranks


def _kernel_states(live: dict[int, RankSamples]) -> None:
    """A rank py-spy could not read (ptrace denied, a process it could not suspend) that the
    kernel shows stopped (state T: SIGSTOP, a debugger) is a stopped rank: a process fact
    read from /proc with no ptrace, for the culprit rule (rules/culprit.py)."""
    for pid, rs in live.items():
        if rs.dumps:
            continue
        try:
            stopped = psutil.Process(pid).status() == psutil.STATUS_STOPPED
        except psutil.Error:
            continue
        if stopped:
            rs.fate = RankFate.STOPPED
            rs.error = f"{rs.error or 'no stack'}; its kernel state is T (stopped)"


def _cpu_seconds(live: dict[int, RankSamples]) -> dict[int, float]:
    """user + system CPU seconds of each live pid (psutil; read-only towards the target)."""
    out = {}
    for pid in live:
        try:
            t = psutil.Process(pid).cpu_times()
            out[pid] = t.user + t.system
        except psutil.Error:
            continue
    return out


def _sample(live: dict[int, RankSamples], deadline_s: float, native: bool, tag: str) -> None:
    for pid, res in dump_stacks(list(live), deadline_s=deadline_s, native=native).items():
        rs = live[pid]
        if res.threads is None:
            if not native:  # the latest plain sample decides; a failed native pass is optional
                rs.error = res.error
            continue
        if not native:
            rs.error = None
        dump = RankDump(rs.rank, pid, rs.title, threads_from_json(res.threads), f"pid {pid} {tag}")
        if native:
            rs.native = dump
        else:
            rs.dumps.append(dump)
            rs.raw.append(res.threads)


def save_samples(ranks: list[RankSamples], folder: Path) -> list[Path]:
    """One JSON envelope per rank and sample, so dumps from several nodes merge with --dumps;
    each written whole (output_paths.write_atomic; the folder was claimed before sampling)."""
    from hicache_diag.evidence.output_paths import write_atomic

    written = []
    now = datetime.now(timezone.utc).isoformat()
    for rs in ranks:
        for n, raw in enumerate(rs.raw):
            name = f"{rs.rank.label.replace(' ', '_')}_pid{rs.pid}_s{n}.json"
            body = {"pid": rs.pid, "title": rs.title, "rank": rs.rank.label, "sample": n}
            body |= {"captured_at": now, "tool": "py-spy", "threads": raw}
            written.append(write_atomic(folder / name, json.dumps(body, indent=1)))
    return written


def _manifest_ranks(folder: Path) -> dict[int, RankId]:
    for candidate in (folder / ev.MANIFEST, folder.parent / ev.MANIFEST):
        try:
            topo = ev.read_record(ev.Manifest, candidate).topology_ranks
            return {int(r.rank): RankId(pp=int(r.pp), tp=int(r.tp)) for r in topo}
        except (OSError, ValueError, AttributeError, TypeError):
            continue
    return {}


def _rank_of(dump: RankDump, path: Path, manifest: dict[int, RankId]) -> RankId | None:
    if dump.rank is not None:
        return dump.rank
    return _rank_of_file(path, manifest)


def _rank_of_file(path: Path, manifest: dict[int, RankId]) -> RankId | None:
    if (rank := parse_rank_tokens(path.stem)) is not None:
        return rank
    if m := _GLOBAL_RANK.search(path.stem):
        return manifest.get(int(m.group(1)), RankId(tp=int(m.group(1))))
    return None


def _dump_files(folder: Path) -> list[Path]:
    """Every regular file under `folder`, walked without following links to folders (a link
    loop is walked once), at most MAX_DUMP_FILES of them."""
    found = []
    for root, dirs, names in os.walk(folder, followlinks=False):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(names):
            path = Path(root) / name
            if not name.startswith(".") and path.is_file():
                found.append(path)
            if len(found) > MAX_DUMP_FILES:
                raise UsageError(
                    f"--dumps {folder}: more than {MAX_DUMP_FILES} files; give the "
                    "folder of one incident's dumps"
                )
    return sorted(found)


def load_dumps(folder: Path) -> list[RankSamples]:
    """Every stack file in `folder` (py-spy JSON or text, faulthandler), grouped by rank."""
    if not folder.is_dir():
        raise UsageError(f"--dumps {folder}: not a directory")
    files = _dump_files(folder)
    manifest = _manifest_ranks(folder)
    by_rank: dict[RankId, RankSamples] = {}
    order: list[tuple[int, RankDump]] = []
    unreadable = 0
    failed: list[RankSamples] = []
    for path in files:
        try:  # UTF-16 from PowerShell's `>` too; a binary, huge or odd file is unreadable
            text = decode_text(ev_files.read_bytes(path, ev_files.MAX_JSON_BYTES))
            dumps = parse_dump_text(text, str(path))
        except (OSError, ValueError, NotALog):
            unreadable += 1
            continue
        if not dumps and (rs := failure_samples(text, _rank_of_file(path, manifest))):
            failed.append(rs)  # py-spy's own failure, read as live triage reads it
            continue
        m = _SAMPLE.search(path.stem)
        for dump in dumps:
            dump.rank = _rank_of(dump, path, manifest)
            order.append((int(m.group(1)) if m else 0, dump))
    if not order and not failed:
        what = f"{len(files)} files" + (f", {unreadable} unreadable" if unreadable else "")
        raise UsageError(f"--dumps {folder}: no py-spy or faulthandler stacks found ({what})")
    unnamed = 0
    for _, dump in sorted(order, key=lambda x: x[0]):
        if dump.rank is None:
            dump.rank, unnamed = RankId(anon=unnamed), unnamed + 1
        rs = by_rank.setdefault(dump.rank, RankSamples(dump.rank, dump.pid, dump.title))
        rs.dumps.append(dump)
    for rs in failed:
        by_rank.setdefault(rs.rank, rs)
    return sorted(by_rank.values(), key=lambda rs: rs.rank.key)
