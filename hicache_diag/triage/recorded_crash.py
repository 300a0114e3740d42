"""The crash records in a recording's held lines (the step a scheduler died in, with its
error: engines/sglang/plugin/recorder.write_crash) as the tracebacks a log would show, so that a
recording read offline gives the crash and its form as the server's log would."""

from __future__ import annotations

import time

from hicache_diag.evidence.ranks import RankId
from hicache_diag.evidence.recording_scan import RankRead
from hicache_diag.logs.model import LogEvidence, LogException
from hicache_diag.rules.signatures import Context


def _stamp(t: object) -> str | None:
    if not isinstance(t, int | float):
        return None
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) + f".{int(t * 1000) % 1000:03d}"


def crash_evidence(reads: dict[int, RankRead], sessions: dict[int, str]) -> LogEvidence:
    """One scheduler exception per crash record, framed as SGLang's `Scheduler hit an
    exception` would be (its rank, its time); PP when any rank is a later stage."""
    found = LogEvidence()
    found.context = Context(pp=any(rr.meta and rr.meta.pp_rank > 0 for rr in reads.values()))
    for r, rr in sorted(reads.items()):
        rank = RankId(rr.meta.pp_rank, rr.meta.tp_rank) if rr.meta else None
        for line in rr.lines:
            error = line.get("error")
            if not (line.get("crashed") and isinstance(error, str) and error):
                continue
            kind, _, message = error.partition(": ")
            source = f"{sessions.get(r, '?')}/rank{r}.jsonl"
            step, ts = int(line.get("step") or 0), _stamp(line.get("t"))
            found.exceptions.append(
                LogException(rank, ts, source, step, kind, message, scheduler=True, header="sched")
            )
    return found
