"""Issue 38 part 3: saved evidence equals live evidence. A saved py-spy dump that holds py-spy's
own failure is concluded as live triage concludes from the same words on py-spy's stderr."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hicache_diag.triage import TriageRequest, run_triage
from hicache_diag.triage.fates import _pyspy_facts
from hicache_diag.triage.hang import RankSamples
from hicache_diag.triage.pyspy import STOPPED

DUMPS = Path(__file__).resolve().parents[3] / "samples" / "dumps" / "pp_hang_pp_sync"
FAILURES = {
    "stopped": (
        "Error: Failed to suspend process\n\nCaused by:\n    0: Failed to suspend process\n"
        "    1: PtraceEvent(Pid(4242), SIGSTOP, 0)\n",
        ("hang", "straggler", "PP1 TP1"),
    ),
    "gone": ("Error: No such process (os error 3)\n", ("crash", None, "PP1 TP1")),
    "denied": (
        "Error: Permission denied (os error 13)\n",
        ("hang", "protocol-deadlock", "PP1 TP0"),
    ),
}


@pytest.mark.parametrize("what", sorted(FAILURES))
def test_a_saved_pyspy_failure_is_read_as_live_triage_reads_it(tmp_path, what):
    text, want = FAILURES[what]
    for src in DUMPS.glob("pyspy_pp*_tp*.txt"):
        if src.name != "pyspy_pp1_tp1.txt":
            shutil.copy(src, tmp_path / src.name)
    (tmp_path / "pyspy_pp1_tp1.txt").write_text(text)
    report = run_triage(TriageRequest(dumps=(tmp_path,)))
    got = (report.kind, report.cause, report.culprit.rank.label if report.culprit else None)
    assert got == want


def test_live_and_saved_words_give_the_same_fact():
    from hicache_diag.evidence.ranks import RankId

    live = RankSamples(RankId(1, 1), 4242, error=STOPPED.format(status="stopped"))
    saved = RankSamples(RankId(1, 1), 4242, error="py-spy failed: " + FAILURES["stopped"][0])
    facts = [_pyspy_facts(_no_logs(), [rs], []) for rs in (live, saved)]
    assert [f[0][3] for f in facts] == [facts[0][0][3]] * 2


def _no_logs():
    from hicache_diag.logs.model import LogEvidence

    return LogEvidence()
