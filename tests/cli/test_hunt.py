"""`hicache-diag hunt` through the CLI: bad input, and a real (builtin) hunt that finds the
legacy protocol's divergence, confirms it on a fresh rerun and says what parted the ranks."""

from __future__ import annotations

import json

import pytest

from hicache_diag.cli.main import run_cli
from tests.conftest import assert_no_children


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--budget", "0"], "--budget '0'"),
        (["--trials", "0"], "--trials must be between 1 and 1000"),
        (["--engine", "builtin", "--out", "{out}"], "give --out to hunt itself"),
        (["--engine", "vllm"], "unknown --engine 'vllm'"),
        (["--engine", "builtin", "--trigger", "nope"], "--trigger 'nope': no such trigger"),
        (["--release", "0.5.23", "--engine", "builtin"], "picks SGLang's engine and Python; drop"),
    ],
)
def test_bad_input_is_one_line_exit_2(capsys, tmp_path, argv, needle):
    argv = [a.replace("{out}", str(tmp_path / "x")) for a in argv]
    if "--out" not in argv:
        argv += ["--out", str(tmp_path / "h")]
    else:  # the pass-through run flag --out comes after hunt's own options
        argv = ["--engine", "builtin", "--", "--out", str(tmp_path / "x")]
    assert run_cli(["hunt", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hicache-diag: error:"), err
    assert needle in err[0], err[0]


@pytest.mark.process  # real builtin trials, each its own process
@pytest.mark.usefixtures("no_leftover_processes")
def test_a_builtin_hunt_finds_the_legacy_divergence_and_confirms_it(tmp_path, capsys):
    out = tmp_path / "hunt"
    argv = [
        "hunt",
        "--engine",
        "builtin",
        "--protocol",
        "legacy",
        "--trials",
        "1",
        "--budget",
        "1",
        "--json",
        "--out",
        str(out),
    ]
    assert run_cli(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report == json.loads((out / "hunt.json").read_text())
    assert report["schema"] == "hicache-diag/hunt/v1" and report["trials_run"] == 1
    assert report["stopped"] == "budget" and report["release"].startswith("builtin")
    first = report["results"][0]
    assert first["trials"] == 1 and first["failures"] == 1, first
    assert first["confirmed"] is True and first["divergent"] is True
    assert first["via"] == "dma-ack-count"  # the legacy protocol's own ack count
    assert "a run of the builtin engine" in first["export"]
    assert report["divergent"] == [first["trigger"]]
    assert_no_children()


@pytest.mark.process  # real builtin trials (the shrink's)
@pytest.mark.usefixtures("no_leftover_processes")
def test_a_perturbations_failure_is_shrunk_before_its_export(tmp_path, monkeypatch):
    """A divergence a fault made is shrunk (fewer faults/requests/steps) and the shrunk run is
    the one exported; the shrink's trials count against the hunt's budget."""
    from pathlib import Path

    from hicache_diag.cli.run import options_from_argv
    from hicache_diag.cli.shrink import run_argv
    from hicache_diag.engines.registry import build
    from hicache_diag.evidence.verdict import Verdict
    from hicache_diag.hunt.model import TriggerResult
    from hicache_diag.hunt.run import HuntConfig, _Budget, _Cell, _shrunk

    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(root)  # the committed run's argv names its scenario relative to the repo
    form_a = root / "samples" / "runs" / "form_a"
    options = options_from_argv(run_argv(form_a))
    result = TriggerResult("host-pool", "test", (), fault=options.faults[0], natural=False)
    result.first_failure = str(form_a)
    budget = _Budget(HuntConfig(options, trials=1, budget_trials=6, out=tmp_path))
    run = _shrunk(result, _Cell(options, build(options)), tmp_path, budget)
    assert 1 <= budget.used <= 6
    assert run != str(form_a) and result.shrunk is not None and result.shrunk["run"] == run
    assert result.shrunk["removed"], result.shrunk
    verdict = Verdict.read(Path(run) / "verdict.json")
    assert (verdict.outcome.value, verdict.form.value) == ("crash", "A")
    assert_no_children()
