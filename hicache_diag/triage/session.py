"""One triage: validate the inputs, gather samples and logs, classify (no rendering here)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from hicache_diag import evidence as ev
from hicache_diag.errors import UsageError
from hicache_diag.evidence.ranks import RankId, unflat_rank
from hicache_diag.logs.files import NotALog, ReadProgress, parse_log_file
from hicache_diag.logs.parse import LogEvidence
from hicache_diag.rules.rank_fate import launcher_fates
from hicache_diag.triage.classify import classify
from hicache_diag.triage.collect import capture_live, load_dumps, save_samples
from hicache_diag.triage.discover import discover_schedulers
from hicache_diag.triage.flight_findings import analyse
from hicache_diag.triage.flight_recorder import read_flight_dir
from hicache_diag.triage.flight_verdict import join_flight
from hicache_diag.triage.hang import RankSamples
from hicache_diag.triage.recorded import Recording, offline_facts, read_recording
from hicache_diag.triage.recorded_dumps import offline_stacks, read_offline
from hicache_diag.triage.recorded_live import (
    collect_answers,
    find_ranks,
    live_recording,
    send,
    unrecorded,
)
from hicache_diag.triage.recorded_report import attach_recording
from hicache_diag.triage.report import TriageReport


@dataclass(frozen=True, slots=True)
class TriageRequest:
    """One triage's inputs, as the command gave them (checked there: cli/triage_flags.py)."""

    pids: tuple[int, ...] = ()
    discover: bool = False
    parent: int | None = None  # limit --discover to this launcher's process tree
    dumps: tuple[Path, ...] = ()
    logs: tuple[Path, ...] = ()
    save: Path | None = None
    samples: int = 2
    interval: float = 0.5
    deadline_s: float = 5.0
    native: bool = False
    num_heads: int | None = None
    pp_size: int | None = None  # the deployment's PP size, when the text may not show it
    progress: ReadProgress | None = None  # (bytes read, bytes in all) while a log is read
    record_dirs: tuple[Path, ...] = ()  # production recordings (`hicache-diag record`)
    flight: tuple[Path, ...] = ()  # folders of Flight Recorder dumps (--fr)


def _live_pids(req: TriageRequest) -> list[int]:
    pids = list(req.pids)
    if req.discover:
        try:
            found = [p.pid for p in discover_schedulers(req.parent)]
        except psutil.NoSuchProcess:
            raise UsageError(f"--parent {req.parent}: no such process") from None
        if not found and not (pids or req.dumps or req.logs or req.record_dirs):
            raise UsageError(
                "--discover: no sglang::scheduler or hicache-diag::scheduler process (a recorded "
                "server that is gone: --record-dir DIR reads what it left)"
            )
        pids += [p for p in found if p not in pids]
    return pids


def _read_logs(paths: tuple[Path, ...], progress: ReadProgress | None = None) -> LogEvidence:
    evidence = LogEvidence()
    for path in paths:
        try:
            evidence.extend(parse_log_file(path, progress))
        except OSError as exc:
            raise UsageError(f"--logs {path}: cannot read ({exc.strerror or exc})") from None
        except NotALog as exc:
            raise UsageError(f"--logs {path}: {exc}") from None
    # Text with nothing recognisable is undecided (kind unknown, exit 3), not bad input: the
    # file was readable, it just says nothing we know.
    return evidence


def run_triage(req: TriageRequest) -> TriageReport:
    pids = _live_pids(req)
    ranks: list[RankSamples] = []
    recording = None
    if pids:
        ask = find_ranks(pids, req.record_dirs)
        if ask.pid_rank:
            send(ask)  # before py-spy: the ranks write their dumps while it samples
        ranks = capture_live(
            pids,
            samples=req.samples,
            interval=req.interval,
            deadline_s=req.deadline_s,
            native=req.native,
        )
        if ask.pid_rank:
            live = collect_answers(ask, ranks, req.deadline_s, req.samples, req.interval)
            recording = live_recording(live, ranks)
        else:
            recording = unrecorded(ask, ranks)
        if req.save:
            save_samples(ranks, req.save)
    run_logs, declared = _read_dumps(req, ranks)
    if req.record_dirs and not pids:
        recording = _offline(req.record_dirs, ranks)
    logs = _read_logs(req.logs + tuple(run_logs), req.progress)
    if recording is not None:
        logs.extend(recording.crashes)
    report = classify(
        ranks, logs, num_heads=req.num_heads, pp_size=req.pp_size, hang_declared=declared
    )
    attach_recording(report, recording, live=bool(pids))
    return _with_flight(report, req.flight)


def _with_flight(report: TriageReport, folders: tuple[Path, ...]) -> TriageReport:
    """The Flight Recorder dumps of --fr joined in (triage/flight_verdict.py)."""
    if not folders:
        return report
    dumps = [d for folder in folders for d in read_flight_dir(folder)]
    return join_flight(report, analyse(dumps))


def _offline(folders: tuple[Path, ...], ranks: list[RankSamples]) -> Recording:
    """A recording read as left (`--record-dir`), its ranks' dumps as their stacks."""
    off = read_offline(list(folders))
    have = {rs.rank for rs in ranks}
    ranks += [rs for rs in offline_stacks(off) if rs.rank not in have]
    facts = offline_facts(off.reads, off.request)
    recording = read_recording(off.reads, [s.name for s in off.sessions], facts)
    recording.evidence += off.notes
    return recording


def _read_dumps(req: TriageRequest, ranks: list[RankSamples]) -> tuple[list[Path], bool]:
    run_logs: list[Path] = []
    declared = False
    for folder in req.dumps:
        # A run directory (manifest.json) also holds each rank's log with its traceback.
        found = sorted(folder.glob(ev.RANK_LOG_GLOB)) if (folder / ev.MANIFEST).is_file() else []
        run_logs += found
        try:
            loaded = load_dumps(folder)
        except UsageError:
            if not found:
                raise
            loaded = []
        declared |= _apply_run_facts(folder, loaded)
        ranks += loaded
    return run_logs, declared


def _record(kind: type[ev.Record], path: Path) -> Any:
    """The run-dir file's record; an empty one when it is missing or not a JSON object."""
    try:
        return ev.read_record(kind, path)
    except (OSError, ValueError):
        return kind()


def _apply_run_facts(folder: Path, ranks: list[RankSamples]) -> bool:
    """A run directory's own process facts (launcher.json: the hang its watch declared, ranks
    stopped or gone then), the facts `run` judges the same stacks with (rules/culprit.py).
    `folder`: the run directory or its stacks/. Whether it records a hang."""
    run_dir = folder if (folder / ev.MANIFEST).is_file() else folder.parent
    launcher = _record(ev.LauncherRecord, run_dir / ev.LAUNCHER)
    hang = launcher.hang
    if not isinstance(hang, ev.HangRecord) or not (run_dir / ev.MANIFEST).is_file():
        return False
    tp_size = _record(ev.Manifest, run_dir / ev.MANIFEST).tp_size
    by_rank = {rs.rank: rs for rs in ranks}
    for rank, fate in launcher_fates(launcher, hang).items():
        rid = RankId(*unflat_rank(rank, tp_size))
        rs = by_rank.get(rid)
        if rs is None:
            rs = by_rank[rid] = RankSamples(rid)
            ranks.append(rs)
        rs.fate = fate
    return True
