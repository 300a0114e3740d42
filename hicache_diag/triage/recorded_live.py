"""Live triage of a recorded server: each scheduler's session from its own environment
(/proc/PID/environ), a dump request written into every session, and a bounded wait for the
ranks that can answer it (a stopped or dead process runs no code: it is never waited for).

A rank py-spy could not read (ptrace denied: a pod without CAP_SYS_PTRACE) is judged from its
in-process dump's stacks instead, as many samples as asked, so the culprit rule still has
stacks; a rank neither could read keeps py-spy's reason and its kernel state.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from hicache_diag.evidence import files
from hicache_diag.evidence import recording as rec
from hicache_diag.evidence.recording_scan import read_meta, read_session
from hicache_diag.rules.rank_fate import RankFate
from hicache_diag.triage.hang import RankSamples
from hicache_diag.triage.recorded import Facts, Recording, join, read_recording
from hicache_diag.triage.recorded_dumps import dump_source, dump_stack

POLL_S = 0.05
KEYS = (rec.SESSION_ENV, rec.RECORD_DIR_ENV)
MAX_ANCESTORS = 8  # scheduler -> launcher -> `hicache-diag record` -> a shell or srun
Key = tuple[Path, int]  # (session, rank)


@dataclass(slots=True)
class Ask:
    """One dump request written into every session found; `pid_rank`: pid -> (session, rank)."""

    id: str
    at: float
    pid_rank: dict[int, Key]
    notes: list[str] = field(default_factory=list)
    named: dict[int, list[Path]] = field(default_factory=dict)  # pid -> places, none holds it
    seen: dict[Path, tuple[float, dict[str, Any]]] = field(default_factory=dict)

    @property
    def sessions(self) -> list[Path]:
        return sorted({s for s, _ in self.pid_rank.values()})


def _environ(pid: int) -> dict[str, str] | None:
    try:
        return psutil.Process(pid).environ()
    except psutil.Error:
        return None


def _rank_in(session: Path, pid: int) -> int | None:
    """The rank whose meta names `pid` (its recorder writes the meta as it starts)."""
    for path in session.glob("rank*.meta.json"):
        head = path.name.split(".", 1)[0].removeprefix("rank")
        if head.isdigit() and (meta := read_meta(session, int(head))) and meta.pid == pid:
            return int(head)
    return None


def _search(folder: Path, pid: int) -> Key | None:
    if not folder.is_dir():
        return None
    candidates = [folder] if any(folder.glob("rank*.meta.json")) else rec.sessions_in(folder)
    for session in candidates:
        if (rank := _rank_in(session, pid)) is not None:
            return session, rank
    return None


def _places(pid: int) -> tuple[list[Path], bool]:
    """The session and record dirs named by the environment of `pid` and of its ancestors,
    nearest first; whether any environment could be read. A scheduler's own is often blank:
    setproctitle writes its title over the environ area (unless SPT_NOENV is set), while the
    launcher above it, which sets no title, keeps its own (the record dir at least)."""
    places, readable, seen = [], False, 0
    while pid > 1 and seen < MAX_ANCESTORS:
        env = _environ(pid)
        readable |= env is not None
        session, folder = (Path(v) if (v := (env or {}).get(k)) else None for k in KEYS)
        if session is not None and folder is not None and not session.is_absolute():
            session = folder / session  # the recorder names its session inside its dir
        places += [p for p in (session, folder) if p is not None]
        try:
            pid, seen = psutil.Process(pid).ppid(), seen + 1
        except psutil.Error:
            break
    return list(dict.fromkeys(places)), readable


def find_ranks(pids: list[int], record_dirs: tuple[Path, ...] = ()) -> Ask:
    """pid -> (session, rank): a session its environment (or an ancestor's) names, or one of
    the record dir named there or given, whose rank meta names the pid: never a guess."""
    ask = Ask("", 0.0, {})
    for pid in pids:
        places, readable = _places(pid)
        found = next((f for f in (_search(p, pid) for p in [*places, *record_dirs]) if f), None)
        if found is not None:
            ask.pid_rank[pid] = found
        elif places:
            ask.named[pid] = places
        elif not readable and not record_dirs:
            ask.notes.append(
                f"pid {pid}: its environment cannot be read (another user's process?): give "
                "--record-dir to read its recording"
            )
    if record_dirs and not ask.pid_rank:
        where = ", ".join(map(str, record_dirs))
        ask.notes.append(f"no live scheduler's pid is in the recordings under {where}")
    return ask


def write_request(session: Path, request_id: str, at: float) -> None:
    """Atomically: a rank never reads half a request (recording_files.write_dump_request)."""
    rec.write_dump_request(session, request_id, at)


def send(ask: Ask, tag: str = "") -> None:
    """A fresh request id into every session; a session we cannot write to is noted."""
    ask.at = time.time()
    ask.id = f"triage-{os.getpid()}-{int(ask.at * 1000)}{tag}"
    for session in ask.sessions:
        try:
            write_request(session, ask.id, ask.at)
        except OSError as exc:
            ask.notes.append(f"could not ask {session.name} for dumps: {exc.strerror or exc}")


def _answers(ask: Ask) -> dict[Key, dict[str, Any]]:
    """(session, rank) -> its dump answering the current request (each file parsed once)."""
    out = {}
    for session in ask.sessions:
        for path in session.glob("rank*.dump-*.json"):
            try:
                mtime = path.stat().st_mtime
                if ask.seen.get(path, (None,))[0] != mtime:
                    ask.seen[path] = (mtime, files.read_json(path))
            except (OSError, ValueError):
                continue  # being replaced, or cut short: read it next time round
            doc = ask.seen[path][1]
            if isinstance(doc, dict) and doc.get("request") == ask.id:
                if isinstance(doc.get("rank"), int):
                    out[(session, doc["rank"])] = doc
    return out


def wait_answers(ask: Ask, expect: set[Key], deadline: float) -> dict[Key, dict[str, Any]]:
    """The answers in by `deadline` (monotonic); as soon as every expected rank's is."""
    while True:
        got = _answers(ask)
        if expect <= set(got) or time.monotonic() >= deadline:
            return got
        time.sleep(POLL_S)


def _silent(pid: int, key: Key, rs: RankSamples | None) -> str | None:
    """Why `pid` cannot answer (stopped, gone, its recorder off), or None."""
    meta = read_meta(*key)
    if meta is not None and not meta.on:
        return f"its recorder is off ({meta.off_reason or 'no reason written'})"
    if meta is not None and getattr(meta, "dumper", True) is False:  # the meta says, when it can
        return "its recorder runs no dumper thread (it answers no dump request)"
    try:
        status = psutil.Process(pid).status()
    except psutil.Error:
        return "its process is gone"
    if status == psutil.STATUS_STOPPED or (rs is not None and rs.fate is RankFate.STOPPED):
        return "its process is stopped (kernel state T): a stopped process runs no code"
    if status == psutil.STATUS_ZOMBIE:
        return "its process has exited (zombie)"
    return None


def add_stacks(
    ranks: list[RankSamples], ask: Ask, got: dict[Key, dict[str, Any]], inproc: set[int]
) -> list[str]:
    """Each rank py-spy could not read (and, on later rounds, each in `inproc`: those already
    judged from their dumps) takes its in-process dump as this sample."""
    used = []
    for rs in ranks:
        doc = got.get(ask.pid_rank.get(rs.pid or -1, (Path(), -1)))
        if doc is None or not (not rs.dumps or rs.error or rs.pid in inproc):
            continue
        dump = dump_stack(doc, rs.rank, rs.pid, dump_source(doc, rs.pid))
        if dump is not None:
            used.append(f"{rs.rank.label} ({rs.error or 'no py-spy stack'})")
            if rs.pid not in inproc:  # py-spy's failed samples are dropped: one kind of sample
                rs.dumps, rs.raw = [], []
            rs.dumps.append(dump)
            rs.error = None
            inproc.add(rs.pid or -1)
    return used


@dataclass(slots=True)
class LiveAsk:
    ask: Ask
    silent: dict[Key, str] = field(default_factory=dict)  # why a rank cannot answer
    answered: set[Key] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)


def collect_answers(
    ask: Ask, ranks: list[RankSamples], deadline_s: float, samples: int, interval: float
) -> LiveAsk:
    """Wait for the first request's answers; stacks py-spy lacks come from them, and, with
    more than one sample asked, from further requests `interval` apart."""
    by_pid = {rs.pid: rs for rs in ranks}
    live = LiveAsk(ask)
    for pid, key in ask.pid_rank.items():
        if (why := _silent(pid, key, by_pid.get(pid))) is not None:
            live.silent[key] = why
    expect = set(ask.pid_rank.values()) - set(live.silent)
    got = wait_answers(ask, expect, time.monotonic() + deadline_s)
    live.answered = set(got)
    inproc: set[int] = set()
    used = add_stacks(ranks, ask, got, inproc)
    for n in range(1, samples if used else 1):
        time.sleep(interval)
        send(ask, f"-s{n}")
        add_stacks(ranks, ask, wait_answers(ask, expect, time.monotonic() + deadline_s), inproc)
    if used:
        live.notes.append(
            "stacks from the ranks' in-process dumps (no ptrace needed), where py-spy could "
            f"not read them: {', '.join(used)}"
        )
    return live


def live_facts(ask: Ask, ranks: list[RankSamples]) -> Facts:
    """The live ranks (PP, TP) -> pid, and why a rank whose environment names a recording
    has none (its recorder could not start there: a read-only or full disk, another user)."""
    facts = Facts(asked=ask.id or None)
    facts.live = {(rs.rank.pp, rs.rank.tp): rs.pid for rs in ranks if rs.rank.known and rs.pid}
    facts.expected = set(facts.live)
    for rs in ranks:
        if rs.pid in ask.named and rs.rank.known:
            where = ", ".join(str(p) for p in ask.named[rs.pid])
            facts.named[(rs.rank.pp, rs.rank.tp)] = (
                f"its environment names a recording ({where}) that holds no file of it: the "
                "recorder could not start there (a read-only or full disk?)"
            )
    return facts


def unrecorded(ask: Ask, ranks: list[RankSamples]) -> Recording | None:
    """Live ranks none of which has a recording: blind where their environment names one
    (never a verdict of their own); None when nothing says they record."""
    if not ask.named:
        return Recording([], [], None, list(ask.notes)) if ask.notes else None
    recording = read_recording({}, [], live_facts(ask, ranks))
    recording.evidence += ask.notes
    return recording


def live_recording(live: LiveAsk, ranks: list[RankSamples]) -> Recording | None:
    """Every session's files, joined by rank, read with the live facts."""
    ask = live.ask
    notes: list[str] = []
    reads = join([read_session(session) for session in ask.sessions], notes)
    if not reads:
        return None
    facts = live_facts(ask, ranks)
    facts.answered = {rank for _, rank in live.answered}
    facts.silent = {rank: why for (_, rank), why in live.silent.items()}
    facts.stacks = {
        ask.pid_rank[rs.pid][1]: rs.dumps[-1] for rs in ranks if rs.pid in ask.pid_rank and rs.dumps
    }
    recording = read_recording(reads, [s.name for s in ask.sessions], facts)
    recording.evidence += ask.notes + live.notes + notes
    return recording
