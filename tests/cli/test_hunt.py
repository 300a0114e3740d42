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
