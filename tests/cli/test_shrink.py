"""`hicache-diag shrink` through the CLI on the committed form A run: fewer requests and a
fault window narrowed to the first divergence, and the shrunk scenario replays form A."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hicache_diag.cli.main import run_cli
from tests.conftest import assert_no_children

ROOT = Path(__file__).resolve().parents[2]
FORM_A = ROOT / "samples" / "runs" / "form_a"
HEALTHY = ROOT / "samples" / "runs" / "healthy"


def test_a_run_that_ended_ok_has_nothing_to_shrink(capsys, tmp_path):
    assert run_cli(["shrink", str(HEALTHY), "--out", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ended ok: nothing to shrink" in err[0], err


@pytest.mark.process  # real builtin trials
@pytest.mark.usefixtures("no_leftover_processes")
def test_shrinking_form_a_keeps_form_a_with_less(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the run's argv names its scenario relative to the repo
    out = tmp_path / "shrink"
    argv = ["shrink", str(FORM_A), "--trials", "1", "--budget", "8", "--json", "--out", str(out)]
    assert run_cli(argv) == 0
    report = json.loads(capsys.readouterr().out)
    before, after = report["before"], report["after"]
    assert report["target"] == {"outcome": "crash", "form": "A"}
    smaller = len(after["faults"]) < len(before["faults"]) or after["requests"] < before["requests"]
    assert smaller and report["removed"] and report["trials_run"] <= 8, report
    # The last failing trial is the shrunk run: it failed the same way, with the shrunk options.
    last = Path(report["last_failing"])
    verdict = json.loads((last / "verdict.json").read_text())
    assert (verdict["outcome"], verdict["form"]) == ("crash", "A")
    from hicache_diag.engines.registry import run_options
    from hicache_diag.faults import load_scenario

    shrunk = run_options(scenario=load_scenario(out / "shrunk.toml"))
    assert (list(shrunk.faults), shrunk.requests) == (after["faults"], after["requests"])
    assert_no_children()
