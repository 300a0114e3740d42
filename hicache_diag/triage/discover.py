"""Find scheduler processes by title and parse their rank tokens (rules.rank_labels' grammar)."""

from __future__ import annotations

from dataclasses import dataclass

import psutil

from hicache_diag.evidence.ranks import (
    RankId,
    is_scheduler_title,
    parse_rank_tokens,
    rank_from_title,
)


@dataclass(frozen=True, slots=True)
class SchedulerProcess:
    pid: int
    title: str
    rank: RankId


def describe_pid(pid: int) -> SchedulerProcess:
    """Title and rank of one pid (rank 0 when the title names none). Raises psutil errors."""
    proc = psutil.Process(pid)
    # setproctitle pads the title with spaces (it reuses argv's memory): strip them.
    title = " ".join(proc.cmdline()).strip() or proc.name()
    return SchedulerProcess(pid, title, rank_from_title(title) or RankId())


def _candidates(parent: int | None) -> list[psutil.Process]:
    if parent is None:
        return list(psutil.process_iter())
    # SGLang's own collect_scheduler_processes walks the launcher's children the same way.
    return psutil.Process(parent).children(recursive=True)


def discover_schedulers(parent: int | None = None) -> list[SchedulerProcess]:
    """Every live process whose cmdline starts with a scheduler title (cmdline, not the 15-byte
    comm, which the kernel truncates to `sglang::schedul`); only `parent`'s tree when given.
    Raises psutil.NoSuchProcess for a missing parent."""
    found = []
    for proc in _candidates(parent):
        try:
            cmdline = " ".join(proc.cmdline()).strip()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if is_scheduler_title(cmdline):
            rank = parse_rank_tokens(cmdline.split(None, 1)[0]) or RankId()
            found.append(SchedulerProcess(proc.pid, cmdline, rank))
    return sorted(found, key=lambda p: (p.rank.key, p.pid))
