"""A request the server aborts itself (SGLANG_REQ_WAITING_TIMEOUT: HTTP 503) is a reply, not a
lost answer: the run stays decidable and says so; a request with no answer still cannot."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from hicache_diag.diagnosis.classify import classify_run
from hicache_diag.engines.sglang.client import abort_message

OK_RUN = Path(__file__).parents[4] / "samples" / "runs" / "sglang-0.5.23-dma-delay"


def test_abort_message_reads_the_servers_abort_and_nothing_else() -> None:
    body = json.dumps({"error": {"message": "Request waiting timeout reached."}})
    assert abort_message(503, body) == "HTTP 503: Request waiting timeout reached."
    assert abort_message(503, "") == "HTTP 503: Service Unavailable"
    finish = {"meta_info": {"finish_reason": {"type": "abort", "message": "aborted by client"}}}
    assert abort_message(200, json.dumps(finish)) == "HTTP 200: aborted by client"
    assert abort_message(500, json.dumps({"error": {"message": "Internal"}})) is None
    assert abort_message(400, json.dumps({"error": {"message": "bad session"}})) is None
    # The scheduler's abort of a turn whose session its timeout reaped (a session-timeout
    # trial sends such turns on purpose): a reply, as printed by 0.5.23 (hunt run, 2026-12-04).
    gone = "Invalid request: session id s003 does not exist"
    assert abort_message(400, json.dumps({"error": {"message": gone}})) == f"HTTP 400: {gone}"


def _run_with(tmp_path: Path, requests: dict) -> Path:
    run = tmp_path / "run"
    shutil.copytree(OK_RUN, run)
    data = json.loads((run / "requests.json").read_text())
    data.update(requests)
    (run / "requests.json").write_text(json.dumps(data))
    return run


def test_server_aborts_keep_an_ok_run_ok_with_a_line(tmp_path: Path) -> None:
    run = _run_with(tmp_path, {"errors": {}, "aborted": {"r0003": "HTTP 503: timeout"}})
    verdict = classify_run(run)
    assert verdict.outcome.value == "ok"
    assert any("1 request(s) aborted by the server itself (r0003" in e for e in verdict.evidence)


def test_a_request_without_answer_still_leaves_the_run_undecided(tmp_path: Path) -> None:
    run = _run_with(tmp_path, {"errors": {"r0003": "URLError: refused"}, "aborted": {}})
    assert classify_run(run).outcome.value == "undecided"


def test_server_env_from_flags_else_the_scenario_table() -> None:
    from hicache_diag.engines.registry import run_options
    from hicache_diag.faults import Scenario

    table = Scenario(options={"engine": "sglang", "sglang_env": {"C": "1"}}, path="s.toml")
    flags = ("SGLANG_REQ_WAITING_TIMEOUT=1.5", "B=x=y")
    assert run_options(scenario=table, sglang_env=flags).server_env() == (
        ("SGLANG_REQ_WAITING_TIMEOUT", "1.5"),
        ("B", "x=y"),
    )
    table = Scenario(options={"engine": "sglang", "sglang_env": {"W": 1.5}}, path="s.toml")
    assert run_options(scenario=table).server_env() == (("W", "1.5"),)
    assert run_options(engine="sglang").server_env() == ()
