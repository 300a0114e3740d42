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
from hicache_diag.triage.hang import RankSamples
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
    return classify(
        ranks, logs, num_heads=req.num_heads, pp_size=req.pp_size, hang_declared=declared
    )


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
