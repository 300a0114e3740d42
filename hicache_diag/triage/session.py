"""One triage: validate the inputs, gather samples and logs, classify (no rendering here)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from hicache_diag import evidence as ev
from hicache_diag.errors import UsageError
from hicache_diag.evidence.ranks import RankId, unflat_rank
from hicache_diag.logs.files import NotALog, Progress, parse_log_file
from hicache_diag.logs.parse import LogEvidence
from hicache_diag.rules.rank_fate import launcher_fates
from hicache_diag.triage.classify import classify
from hicache_diag.triage.collect import capture_live, load_dumps, save_samples
from hicache_diag.triage.discover import discover_schedulers
from hicache_diag.triage.flight_findings import analyse
from hicache_diag.triage.flight_recorder import read_flight_dir
from hicache_diag.triage.flight_verdict import join_flight
from hicache_diag.triage.hang import RankSamples
from hicache_diag.triage.report import TriageReport


@dataclass(frozen=True, slots=True)
class TriageRequest:
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
    progress: Progress | None = None  # (bytes read, bytes in all) while a log is read
    flight: tuple[Path, ...] = ()  # folders of Flight Recorder dumps (--fr)

    def __post_init__(self) -> None:
        if not (self.pids or self.discover or self.dumps or self.logs or self.flight):
            raise UsageError("nothing to triage: give --pid, --discover, --dumps, --logs or --fr")
        bad = [p for p in self.pids if p < 1]
        if bad:
            raise UsageError(f"--pid must be a positive process id, got {bad[0]}")
        if not (math.isfinite(self.interval) and math.isfinite(self.deadline_s)):
            raise UsageError("--interval and --deadline must be finite numbers of seconds")
        if self.samples < 1:
            raise UsageError(f"--samples must be at least 1, got {self.samples}")
        if self.interval < 0 or self.deadline_s <= 0:
            raise UsageError("--interval must be >= 0 and --deadline > 0")
        if self.save and not (self.pids or self.discover):
            raise UsageError("--save writes live samples: use it with --pid or --discover")
        if self.parent is not None and not self.discover:
            raise UsageError("--parent limits --discover: give both")
        if self.num_heads is not None and self.num_heads < 1:
            raise UsageError(f"--num-heads must be positive, got {self.num_heads}")
        if self.pp_size is not None and self.pp_size < 1:
            raise UsageError(f"--pp-size must be positive, got {self.pp_size}")


def _live_pids(req: TriageRequest) -> list[int]:
    pids = list(req.pids)
    if req.discover:
        try:
            found = [p.pid for p in discover_schedulers(req.parent)]
        except psutil.NoSuchProcess:
            raise UsageError(f"--parent {req.parent}: no such process") from None
        if not found and not (pids or req.dumps or req.logs):
            raise UsageError("--discover: no sglang::scheduler or hicache-diag::scheduler process")
        pids += [p for p in found if p not in pids]
    return pids


def _read_logs(paths: tuple[Path, ...], progress: Progress | None = None) -> LogEvidence:
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
    if pids:
        ranks = capture_live(
            pids,
            samples=req.samples,
            interval=req.interval,
            deadline_s=req.deadline_s,
            native=req.native,
        )
        if req.save:
            save_samples(ranks, req.save)
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
    logs = _read_logs(req.logs + tuple(run_logs), req.progress)
    report = classify(
        ranks, logs, num_heads=req.num_heads, pp_size=req.pp_size, hang_declared=declared
    )
    return _with_flight(report, req.flight)


def _with_flight(report: TriageReport, folders: tuple[Path, ...]) -> TriageReport:
    """The Flight Recorder dumps of --fr joined in (triage/flight_verdict.py)."""
    if not folders:
        return report
    dumps = [d for folder in folders for d in read_flight_dir(folder)]
    return join_flight(report, analyse(dumps))


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
