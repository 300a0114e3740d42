"""Triage and the run classifier read one rule book: fed the same logs and dumps, they agree."""

from __future__ import annotations

from pathlib import Path

import pytest

from hicache_diag.diagnosis import stacks as run_stacks
from hicache_diag.diagnosis.tracebacks import parse_crash
from hicache_diag.logs.crash import find_crash
from hicache_diag.logs.parse import parse_log_lines
from hicache_diag.rules.wait_sites import HICACHE_KINDS, classify_thread
from hicache_diag.triage.collect import load_dumps

SAMPLES = Path(__file__).resolve().parents[3] / "samples"
LOGS = sorted(SAMPLES.glob("logs/*.log")) + sorted(SAMPLES.glob("runs/*/rank*.log"))
LOGS += sorted(p for p in (SAMPLES / "corpus").rglob("*.log"))
DUMP_DIRS = [p for p in sorted((SAMPLES / "dumps").iterdir()) if p.is_dir()]
DUMP_DIRS += [p for p in sorted((SAMPLES / "corpus").iterdir()) if any(p.glob("*.txt"))]
DUMP_DIRS += sorted((SAMPLES / "corpus").glob("*/dumps"))  # real SGLang 0.5.23 --save dumps


@pytest.mark.parametrize("log", LOGS, ids=lambda p: str(p.relative_to(SAMPLES)))
def test_triage_and_run_classifier_give_one_form(log):
    text = log.read_text(errors="replace")
    ev = parse_log_lines(text.splitlines(), str(log))
    tracebacks = [e for e in ev.exceptions if e.frames]
    run_view = parse_crash(0, text)  # the run classifier's reading of a rank log
    if not tracebacks:
        assert run_view is None
        return
    triage_forms = {find_crash([e], None, ev.context).form for e in tracebacks if not e.is_timeout}
    triage_forms = {f for f in triage_forms if f} or {None}
    run_form = run_view.kind if run_view.kind in ("A", "B") else None
    # The run classifier reports the strongest form among a rank's exceptions; triage finds
    # the same form for at least one of them, and never a form the classifier does not.
    assert run_form in triage_forms
    assert not ({"A", "B"} & triage_forms) or run_form is not None


@pytest.mark.parametrize("folder", DUMP_DIRS, ids=lambda p: str(p.relative_to(SAMPLES)))
def test_triage_wait_sites_and_run_classifier_agree_on_hicache_waits(folder):
    for rs in load_dumps(folder):
        for dump in rs.dumps:
            site = classify_thread(dump.main_thread())
            hicache_site = site.kind in HICACHE_KINDS
            # The run classifier names a rank by its HiCache protocol function; triage's wait
            # site for the same stack must be a HiCache site exactly when it does.
            assert (run_stacks.hicache_wait(dump) is not None) == hicache_site, (
                folder.name,
                rs.rank.label,
                site.site,
            )
