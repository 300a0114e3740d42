"""A saved py-spy dump that holds py-spy's own failure instead of a stack (`py-spy dump --pid N
> rank3.txt` on a rank it could not read): the same words live triage reads from py-spy's
stderr, concluded the same way (rules.process_fate.pyspy_fate): could not suspend it (SIGSTOP,
`Failed to suspend process`, a `PtraceEvent(..., SIGSTOP ...)` status) is a stopped rank, `No
such process` a rank gone, ptrace denied or py-spy missing says nothing of the rank."""

from __future__ import annotations

import re

from hicache_diag.evidence.ranks import RankId
from hicache_diag.triage.hang import RankSamples

# py-spy's own error output (anyhow's `Error: ...` / `Caused by:`), SGLang's report of it.
_FAILURE = re.compile(
    r"^\s*(?:Error: |Caused by:|\d+: )|Failed to suspend process|PtraceEvent\(|No such process"
    r"|Permission denied|Operation not permitted|Pyspy failed|All pyspy dump attempts failed",
    re.M,
)
_PID = re.compile(r"Pid\((\d{1,10})\)|--pid (\d{1,10})|PID (\d{1,10})|\bpid[_=]?(\d{1,10})\b", re.I)


def failure_samples(text: str, rank: RankId | None) -> RankSamples | None:
    """The rank's samples as live triage would hold them after the same failure: no dump,
    py-spy's words as the error (a fact about the rank when they say stopped or gone)."""
    if not _FAILURE.search(text):
        return None
    words = " ".join(line.strip() for line in text.splitlines() if line.strip())[:400]
    pid_match = _PID.search(text)
    pid = int(next(g for g in pid_match.groups() if g)) if pid_match else None
    return RankSamples(rank or RankId(anon=0), pid, None, error=f"py-spy failed: {words}")
