"""`hicache-diag timeline` end to end: real ranks, measured latencies, bad input, no leftovers."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from hicache_diag.cli.main import app, run_cli


def _json_run(capsys, *args: str) -> dict:
    code = run_cli(["timeline", "--json", *args])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def _delays(doc: dict) -> dict[str, int]:
    return {e["event"]: e["delay_iters"] for e in doc["events"]}


@pytest.mark.process
def test_pp2_one_async_slot_measures_plus1_and_plus3(capsys, no_leftover_processes):
    doc = _json_run(capsys, "--pp", "2", "--async-depth", "1")
    assert doc["schema"] == "hicache-diag/timeline/v1" and doc["loop_size"] == 3
    assert _delays(doc) == {"load": 1, "write": 3}
    write = next(e for e in doc["events"] if e["event"] == "write")
    assert write["issued_iter"] == 2, "process_batch_result runs loop_size - 1 slots later"
    assert write["ack_queued_iter"] == 2 and doc["samples"] >= 3 and doc["ranks_agree"]


@pytest.mark.process
def test_loop_size_two_measures_plus1_and_plus2(capsys, no_leftover_processes):
    doc = _json_run(capsys, "--pp", "2", "--async-depth", "0")
    assert doc["loop_size"] == 2 and _delays(doc) == {"load": 1, "write": 2}
    assert doc["formula"] == {"load": 1, "write": 2}


@pytest.mark.process
def test_table_output_and_kept_run_dir(tmp_path, no_leftover_processes):
    result = CliRunner().invoke(app, ["timeline", "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert "write_ack" in result.output and "+3" in result.output
    assert (tmp_path / "run" / "rank0.jsonl").is_file(), "--out keeps the records"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--pp", "0"], "--pp must be >= 1"),
        (["--async-depth", "-1"], "--async-depth must be between 0 and 8"),
        (["--requests", "2"], "--requests must be >= 6"),
        # 4 and 5 passed this check, then found no host hit and exited 1 (issue 29)
        (["--requests", "4"], "the workload's first 4 requests have 4 different prefixes"),
        (["--requests", "5"], "--requests must be >= 6"),
        (["--pp", "9"], "exceeds the model's"),
    ],
)
def test_bad_input_is_one_line_exit_2(capsys, args, needle, no_leftover_processes):
    assert run_cli(["timeline", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]


@pytest.mark.process
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_smallest_accepted_request_count_measures(seed, capsys, no_leftover_processes):
    from hicache_diag.cli.timeline import MIN_REQUESTS

    args = ["timeline", "--requests", str(MIN_REQUESTS), "--seed", str(seed), "--json"]
    assert run_cli(args) == 0, capsys.readouterr().err
    table = json.loads(capsys.readouterr().out)
    assert table["samples"] >= 1 and table["formula"] == {"load": 1, "write": 3}
