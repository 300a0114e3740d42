"""`hicache-diag run` through the CLI: bad input is one line + exit 2; --json is JSON only."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from hicache_diag.cli.main import app, run_cli
from tests.conftest import assert_no_children

# The malformed-input table lives in tests/cli/bad_inputs.py (test_bad_input.py runs it).


def build_run_config(argv):
    """The builtin config `run ARGV` would build (the scenario read as run reads it)."""
    from hicache_diag.cli.run import options_from_argv
    from hicache_diag.engines.registry import build

    return build(options_from_argv(argv))


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
        "--switch",
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
    sc = tmp_path / "s.toml"
    sc.write_text(
        'pp = 3\nprotocol = "legacy"\nfix = ["ack-count=leader"]\nstorage_backend = "file"\n'
        'requests = 5\n\n[[fault]]\nname = "p2p-delay"\nrank = 1\nms = 5\n'
    )
    cfg = build_run_config(["--scenario", str(sc), "--requests", "9", "--fault", "rank-stall:ms=1"])
    assert cfg.server_args.pp_size == 3 and cfg.workload.requests == 9
    assert cfg.server_args.hicache_storage_backend == "file"
    assert cfg.protocol.mode("ack-count") == "leader" and cfg.protocol.mode("l3-hit") == "local"
    assert [f.split(":")[0] for f in cfg.faults] == ["p2p-delay", "rank-stall"]
    cfg = build_run_config(["--scenario", str(sc), "--pp", "2"])
    assert cfg.server_args.pp_size == 2


def test_fault_outside_the_topology_is_bad_input(capsys):
    assert run_cli(["run", "--pp", "2", "--fault", "rank-stall:rank=5,ms=1"]) == 2
    assert "rank" in capsys.readouterr().err


def test_protocol_on_the_command_line_drops_the_scenario_fix_list(tmp_path):
    sc = tmp_path / "s.toml"
    sc.write_text('protocol = "legacy"\nfix = ["ack-count=leader"]\n')
    kept = build_run_config(["--scenario", str(sc)])
    assert kept.protocol.mode("ack-count") == "leader" and kept.protocol.preset == "legacy+fixes"
    full = build_run_config(["--scenario", str(sc), "--protocol", "full"])
    assert full.protocol.as_dict() == build_run_config(["--protocol", "full"]).protocol.as_dict()
    mixed = build_run_config(
        ["--scenario", str(sc), "--protocol", "full", "--switch", "lru-clock=monotonic"]
    )
    assert mixed.protocol.mode("lru-clock") == "monotonic"
    assert mixed.protocol.mode("ack-count") == "leader-batched"


def _scenario_file(tmp_path, text, name="s.toml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.process  # the sglang case probes an interpreter in a subprocess
@pytest.mark.parametrize(
    ("text", "args", "needle"),
    [
        (None, [], "--check needs --scenario FILE with an [expect] table"),
        ("pp = 2\n", [], "has no [expect] table"),
        (
            'sglang_version = "0.5.23"\n[expect]\noutcome = "ok"\n',
            [],
            "scenario key 'sglang_version' applies to engine = \"sglang\" only",
        ),
        (
            'engine = "sglang"\nsglang_version = "0.0.1"\n[expect]\noutcome = "ok"\n',
            [],
            "this scenario replays sglang 0.0.1 but",
        ),
    ],
)
def test_check_refusals_are_one_line_and_exit_2(capsys, tmp_path, text, args, needle):
    scenario = ["--scenario", _scenario_file(tmp_path, text)] if text else []
    assert run_cli(["run", "--check", *scenario, *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.process  # runs real ranks
def test_check_exits_0_on_a_match_and_4_on_a_mismatch(tmp_path):
    """A real (small, green) builtin run checked twice: the exit status is the match."""
    base = 'pp = 2\nrequests = 4\nmax_new_tokens = 2\n\n[[fault]]\nname = "p2p-delay"\n'
    base += "rank = 0\nms = 1\n\n[expect]\n"
    good = _scenario_file(tmp_path, base + 'outcome = "ok"\nform = "none"\n', "good.toml")
    bad = _scenario_file(tmp_path, base + 'outcome = "crash"\nform = "B"\n', "bad.toml")
    runner = CliRunner()
    ok = runner.invoke(app, ["run", "--scenario", good, "--check", "--out", str(tmp_path / "a")])
    assert ok.exit_code == 0, ok.output
    assert "check: ok, the verdict matches [expect] outcome=ok form=none" in ok.output
    no = runner.invoke(
        app, ["run", "--scenario", bad, "--check", "--json", "--out", str(tmp_path / "b")]
    )
    assert no.exit_code == 4, no.output
    assert "check: MISMATCH against [expect] outcome=crash form=B" in no.output
    assert "outcome: expected crash, got ok" in no.output
    assert_no_children()


@pytest.mark.process  # runs real ranks, one trial process each
@pytest.mark.usefixtures("no_leftover_processes")
def test_a_rate_scenario_runs_its_trials_and_judges_the_interval(tmp_path):
    """`trials = 3`: three real trials, each its own run dir and seed; a rate the trials
    cannot refute passes, one they refute exits 4 naming the interval."""
    base = "pp = 2\nrequests = 4\nmax_new_tokens = 2\n\n[expect]\ntrials = 3\n"
    good = _scenario_file(tmp_path, base + 'outcome = "ok"\nrate_at_least = 0.5\n', "g.toml")
    bad = _scenario_file(tmp_path, base + 'outcome = "crash"\nrate_at_least = 0.9\n', "b.toml")
    out = tmp_path / "good"
    assert run_cli(["run", "--scenario", good, "--check", "--json", "--out", str(out)]) == 0
    runs = sorted(p.parent.name for p in out.glob("cell0-base/*/verdict.json"))
    assert runs == ["trial0-seed0", "trial1-seed1", "trial2-seed2"]
    runner = CliRunner()
    no = runner.invoke(
        app, ["run", "--scenario", bad, "--check", "--json", "--out", str(tmp_path / "bad")]
    )
    assert no.exit_code == 4, no.output
    data = json.loads(no.stdout)
    assert (data["matched"], data["decided"]) == (0, 3)
    want = "rate: expected at least 0.9, got 0/3 (95% interval [0.00, 0.56])"
    assert data["mismatches"] == [want]
    assert_no_children()
