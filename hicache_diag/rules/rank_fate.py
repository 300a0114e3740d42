"""What a rank's process did, as the culprit rule (rules/culprit.py) takes it, and how a run
directory's launcher.json tells it (docs/evidence.md): `run` and `triage --dumps RUN` read the
same facts through `launcher_fates`."""

from __future__ import annotations

import enum
from typing import Any


class RankFate(str, enum.Enum):
    ALIVE = "alive"
    EXITED = "exited"  # gone while its peers live (or its stack is a post-mortem picture)
    STOPPED = "stopped"  # kernel state T: SIGSTOP or a debugger


_STOPPED = frozenset({"stopped", "tracing-stop"})  # psutil's names for `T` and `t`
_GONE = frozenset({"gone", "zombie", "dead"})  # psutil's, and harness/proc_facts' "gone"
_ENDED = frozenset({"exited", "crashed"})  # launcher.json: it ended on its own


def stopped_ranks(hang: dict[str, Any]) -> list[int]:
    """Ranks the kernel showed stopped (`T`) when the hang was declared."""
    found = {int(r) for r in hang.get("stopped_ranks") or ()}
    found |= {int(r) for r, s in (hang.get("proc_status") or {}).items() if s in _STOPPED}
    return sorted(found)


def launcher_fates(launcher: dict[str, Any] | None, hang: dict[str, Any]) -> dict[int, RankFate]:
    """launcher.json and its hang record -> each launched rank's fate when the hang was
    declared: stopped, gone before it (ended on its own and not among the stalled ranks), else
    alive."""
    entries = list((launcher or {}).get("ranks") or [])
    stopped = set(stopped_ranks(hang))
    status = hang.get("proc_status") or {}
    stalled = {int(r) for r in hang.get("stalled_ranks") or ()}
    fates = {}
    for rank in sorted({int(e["rank"]) for e in entries} | stalled | stopped):
        ended = any(int(e["rank"]) == rank and e.get("state") in _ENDED for e in entries)
        if rank in stopped:
            fates[rank] = RankFate.STOPPED
        elif status.get(str(rank)) in _GONE or (ended and rank not in stalled):
            fates[rank] = RankFate.EXITED  # its peers lost it
        else:
            fates[rank] = RankFate.ALIVE
    return fates
