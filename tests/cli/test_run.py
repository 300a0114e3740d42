"""`hicache-diag run` through the CLI: bad input is one line + exit 2; --json is JSON only."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from hicache_diag.cli.main import app, run_cli

# The malformed-input table lives in tests/cli/bad_inputs.py (test_bad_input.py runs it).


def test_out_that_is_a_file_is_rejected(capsys, tmp_path):
    target = tmp_path / "afile"
    target.write_text("x")
    assert run_cli(["run", "--out", str(target / "run")]) == 2
    assert "is not writable" in capsys.readouterr().err


def test_help_lists_the_shared_flags():
    res = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "240"})
    assert res.exit_code == 0
    out = res.output
    for flag in (
        "--fault",
        "--fix",
        "--protocol",
        "--scenario",
        "--async-depth",
        "--storage-dir",
        "--hicache-storage-backend",
        "--hang-timeout",
        "--device",
    ):
        assert flag in out


@pytest.mark.usefixtures("no_leftover_processes")
@pytest.mark.process
def test_json_run_prints_only_the_verdict(tmp_path):
    out = tmp_path / "run"
    res = CliRunner().invoke(
        app, ["run", "--pp", "2", "--requests", "4", "--seed", "7", "--json", "--out", str(out)]
    )
    assert res.exit_code == 0, res.output
    verdict = json.loads(res.stdout)  # stdout is exactly one JSON document
    assert verdict["schema"] == "hicache-diag/verdict/v1"
    assert verdict["outcome"] == "ok" and verdict["exit_code"] == 0
    assert verdict["run_dir"] == str(out.resolve())
    for name in (
        "manifest.json",
        "rank0.jsonl",
        "rank1.jsonl",
        "rank0.log",
        "outputs.json",
        "reference.json",
        "launcher.json",
        "verdict.json",
    ):
        assert (out / name).exists(), name
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["topology"]["world_size"] == 2 and manifest["seed"] == 7
    assert manifest["protocol"]["ack-count"] == "leader-batched"


def test_scenario_fills_in_and_the_command_line_wins(tmp_path):
    from hicache_diag.cli.run import build_run_config

    sc = tmp_path / "s.toml"
    sc.write_text(
        'pp = 3\nprotocol = "legacy"\nfix = ["ack-count=leader"]\nstorage_backend = "file"\n'
        'requests = 5\n\n[[fault]]\nname = "p2p-delay"\nrank = 1\nms = 5\n'
    )
    cfg = build_run_config({"scenario": str(sc), "requests": 9, "fault": ["rank-stall:ms=1"]})
    assert cfg.server_args.pp_size == 3 and cfg.workload.requests == 9
    assert cfg.server_args.hicache_storage_backend == "file"
    assert cfg.protocol.mode("ack-count") == "leader" and cfg.protocol.mode("l3-hit") == "local"
    assert [f.split(":")[0] for f in cfg.faults] == ["p2p-delay", "rank-stall"]
    cfg = build_run_config({"scenario": str(sc), "pp": 2})
    assert cfg.server_args.pp_size == 2


def test_fault_outside_the_topology_is_bad_input(capsys):
    assert run_cli(["run", "--pp", "2", "--fault", "rank-stall:rank=5,ms=1"]) == 2
    assert "rank" in capsys.readouterr().err


def test_protocol_on_the_command_line_drops_the_scenario_fix_list(tmp_path):
    from hicache_diag.cli.run import build_run_config

    sc = tmp_path / "s.toml"
    sc.write_text('protocol = "legacy"\nfix = ["ack-count=leader"]\n')
    kept = build_run_config({"scenario": str(sc)})
    assert kept.protocol.mode("ack-count") == "leader" and kept.protocol.preset == "legacy+fixes"
    full = build_run_config({"scenario": str(sc), "protocol": "full"})
    assert full.protocol.as_dict() == build_run_config({"protocol": "full"}).protocol.as_dict()
    mixed = build_run_config(
        {"scenario": str(sc), "protocol": "full", "fix": ["lru-clock=monotonic"]}
    )
    assert mixed.protocol.mode("lru-clock") == "monotonic"
    assert mixed.protocol.mode("ack-count") == "leader-batched"
