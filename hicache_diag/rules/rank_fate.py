"""What a rank's process did, as the culprit rule (rules/culprit.py) takes it, and how a run
directory's launcher.json tells it (docs/evidence.md): `run` and `triage --dumps RUN` read the
same facts through `launcher_fates`."""

from __future__ import annotations

import enum

from hicache_diag import evidence as ev


class RankFate(str, enum.Enum):
    ALIVE = "alive"
    EXITED = "exited"  # gone while its peers live (or its stack is a post-mortem picture)
    STOPPED = "stopped"  # kernel state T: SIGSTOP or a debugger


_STOPPED = frozenset({"stopped", "tracing-stop"})  # psutil's names for `T` and `t`
_GONE = frozenset({"gone", "zombie", "dead"})  # psutil's, and trials/proc_facts' "gone"
_ENDED = frozenset({"exited", "crashed"})  # launcher.json: it ended on its own


def stopped_ranks(hang: ev.HangRecord | None) -> list[int]:
    """Ranks the kernel showed stopped (`T`) when the hang was declared."""
    if hang is None:
        return []
    found = {int(r) for r in hang.stopped_ranks or ()}
    found |= {int(r) for r, s in (hang.proc_status or {}).items() if s in _STOPPED}
    return sorted(found)


def launcher_fates(launcher: ev.LauncherRecord | None, hang: ev.HangRecord) -> dict[int, RankFate]:
    """launcher.json and its hang record -> each launched rank's fate when the hang was
    declared: stopped, gone before it (ended on its own and not among the stalled ranks), else
    alive."""
    entries = launcher.ranks if launcher is not None else []
    stopped = set(stopped_ranks(hang))
    status = hang.proc_status or {}
    stalled = {int(r) for r in hang.stalled_ranks or ()}
    fates = {}
    for rank in sorted({int(e.rank) for e in entries} | stalled | stopped):
        ended = any(int(e.rank) == rank and e.state in _ENDED for e in entries)
        if rank in stopped:
            fates[rank] = RankFate.STOPPED
        elif status.get(str(rank)) in _GONE or (ended and rank not in stalled):
            fates[rank] = RankFate.EXITED  # its peers lost it
        else:
            fates[rank] = RankFate.ALIVE
    return fates
