"""Process facts in launcher.json -> findings: ranks that died by a signal, ranks that stopped,
and each rank's view for the hang's culprit rule (rules/culprit.py).

What the launcher and the kernel saw is evidence as strong as a traceback: a rank SIGKILLed (by
a user or the OOM killer) leaves no traceback, its survivors log `Connection closed by peer`
(the cascade), and a SIGSTOPped rank leaves its peers waiting in perfectly healthy waits.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

from hicache_diag import evidence as ev
from hicache_diag.evidence.ranks import RankId, unflat_rank
from hicache_diag.evidence.stacks import RankDump
from hicache_diag.rules.culprit import RankView, view_of
from hicache_diag.rules.rank_fate import RankFate, launcher_fates
from hicache_diag.rules.rank_fate import stopped_ranks as stopped_ranks


def signal_label(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


@dataclass(frozen=True, slots=True)
class RankDeath:
    """A rank that ended on its own with no traceback: by a signal, or a bare non-zero exit."""

    rank: int
    signal: int | None
    exitcode: int | None
    oom: bool = False

    @property
    def how(self) -> str:
        if self.signal is None and self.exitcode is None:
            return (
                "vanished without a traceback (its exit status was not visible: a signal, "
                "e.g. SIGKILL from a user or the OOM killer)"
            )
        if self.signal is None:
            return f"exited with code {self.exitcode} without a traceback"
        name = signal_label(self.signal)
        if self.oom:
            return f"was killed by {name} (the OOM killer: the cgroup counted an OOM kill)"
        if self.signal == signal.SIGKILL:
            return f"was killed by {name} (a user, a supervisor or the OOM killer)"
        return f"was killed by {name}"


def rank_deaths(
    launcher: ev.LauncherRecord | None, with_traceback: set[int]
) -> dict[int, RankDeath]:
    """Ranks the launcher saw end badly on their own (state `crashed`: not killed or reaped by
    us), minus those whose log holds a traceback (the traceback says more)."""
    if launcher is None:
        return {}
    oom = bool(launcher.oom_kills)
    deaths = {}
    for entry in launcher.ranks:
        rank = int(entry.rank)
        if entry.state != "crashed" or rank in with_traceback:
            continue
        sig, rc = entry.signal, entry.exitcode
        if sig is None and isinstance(rc, int) and rc < 0:
            sig = -rc
        if sig is None and not rc and not entry.vanished:
            continue
        deaths[rank] = RankDeath(rank, sig, rc, oom and sig == signal.SIGKILL)
    return deaths


def first_failed_rank(launcher: ev.LauncherRecord | None) -> int | None:
    first = launcher.first_failure if launcher is not None else None
    return int(first.rank) if first is not None and first.rank is not None else None


def stop_lines(hang: ev.HangRecord, stopped: list[int]) -> list[str]:
    lines = []
    for r in stopped:
        lines.append(
            f"rank {r} was stopped (kernel state T: SIGSTOP or a debugger) while its peers "
            "waited for it"
        )
    if hang.during_startup:
        lines.append("the hang came during start-up: no rank had written its first step")
    return lines


def rank_views(
    launcher: ev.LauncherRecord | None,
    hang: ev.HangRecord,
    stacks: dict[int, RankDump],
    tp_size: int,
) -> dict[int, RankView]:
    """Every rank launcher.json or the stacks know -> its view for the culprit rule: its saved
    stack (one sample) and its fate as the hang record and launcher.json tell it."""
    fates = launcher_fates(launcher, hang)
    views = {}
    for rank in sorted(set(fates) | set(stacks)):
        dumps = [stacks[rank]] if rank in stacks else []
        rid = RankId(*unflat_rank(rank, tp_size))
        views[rank] = view_of(rid, dumps, fates.get(rank, RankFate.ALIVE))
    return views
