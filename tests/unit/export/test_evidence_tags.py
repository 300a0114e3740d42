"""An export's recipe follows the mechanism the run's evidence names (the `sources` probes,
`sessions_closed`, SGLang's per-rank flush log lines), not the run dir's name or crash line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from hicache_diag.export.evidence_tags import FLUSH, SESSION, SHORTAGE, WAITING, run_tags
from hicache_diag.export.recipes import FLUSH_DEADLINE, SESSION_REAP, WAITING_TIMEOUT, find_recipe

RUNS = Path(__file__).resolve().parents[3] / "samples" / "runs"


def test_committed_runs_name_their_mechanism():
    assert set(run_tags(RUNS / "sglang-0.5.23-session-close")) == {SESSION}
    assert set(run_tags(RUNS / "sglang-0.5.23-session-timeout")) == {SESSION}
    assert set(run_tags(RUNS / "sglang-0.5.23-session-close-sources")) == {SESSION}
    assert set(run_tags(RUNS / "sglang-0.5.23-flush-clock")) == {FLUSH}
    # session-clock values recorded there but never apart: only the waiting timeout is named
    assert set(run_tags(RUNS / "sglang-0.5.19-waiting-timeout")) == {WAITING}
    for run in ("form-a", "form-b", "form-c-tp"):
        assert set(run_tags(RUNS / f"sglang-0.5.23-{run}")) == {SHORTAGE}
    assert run_tags(RUNS / "sglang-0.5.23-dma-delay") == {}


def test_shortage_tag_names_the_short_rank_and_topology_from_the_step_lines():
    a = run_tags(RUNS / "sglang-0.5.23-form-a")[SHORTAGE]
    assert a.step == 79 and a.values == {
        "topology": "pp",
        "short_rank": 0,
        "kv_tokens": 56,
        "roomy_host_free": 516,
    }
    c = run_tags(RUNS / "sglang-0.5.23-form-c-tp")[SHORTAGE]
    assert c.step == 46 and c.values["topology"] == "tp" and c.values["short_rank"] == 1


def test_session_tag_quotes_the_steps_per_rank():
    tag = run_tags(RUNS / "sglang-0.5.23-session-timeout")[SESSION]
    assert "rank 0 none; rank 1 at step(s) 155" in tag.says and tag.step == 155


def test_recipe_by_evidence_whatever_the_crash_line():
    # a form A crash in the model's forward: no crash-line recipe would match it
    assert find_recipe("A", "forward_native", "base.py", 1, tags={SESSION}) is SESSION_REAP
    assert find_recipe("A", "forward_native", "base.py", 1, tags={FLUSH}) is FLUSH_DEADLINE
    assert find_recipe(None, None, None, 1, tags={WAITING}) is WAITING_TIMEOUT
    assert find_recipe("A", "forward_native", "base.py", 1) is None


def test_waiting_tag_needs_a_server_timeout_abort_among_the_requests_apart(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(RUNS / "sglang-0.5.19-waiting-timeout", run)
    tag = run_tags(run)[WAITING]
    assert "rank 1 ran ['o012']" in tag.says and "17 requests" in tag.says
    reqs = json.loads((run / "requests.json").read_text())
    reqs["aborted"].pop("o012")
    (run / "requests.json").write_text(json.dumps(reqs))
    assert run_tags(run) == {}


def test_a_renamed_run_dir_keeps_its_recipe_and_a_stripped_one_loses_it(tmp_path):
    run = tmp_path / "some-run"
    shutil.copytree(RUNS / "sglang-0.5.23-session-timeout", run)
    assert set(run_tags(run)) == {SESSION}
    for path in run.glob("rank*.jsonl"):
        rows = [json.loads(ln) for ln in path.read_text().splitlines()]
        for row in rows:
            row.pop("sessions_closed", None)
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert run_tags(run) == {}


def test_flush_outcomes_apart_in_the_logs(tmp_path):
    for rank, outcome in (
        (0, "Deferred flush_cache timed out while waiting for idle state."),
        (1, "Cache flushed successfully!"),
    ):
        (tmp_path / f"rank{rank}.log").write_text(f"[2026-12-02 03:25:55 PP{rank}] {outcome}\n")
    tag = run_tags(tmp_path)[FLUSH]
    assert "rank 0 timed out" in tag.says and "rank 1 flushed" in tag.says
    (tmp_path / "rank1.log").write_text("[2026-12-02 03:25:55 PP1] Deferred flush_cache timed out")
    assert run_tags(tmp_path) == {}


def _drops(path: Path, steps: dict[int, list[str]]) -> None:
    rows = [
        {"step": s, "rank": 0, "sources": {"waiting-clock": {"n": 1, "v": [0.1], "d": [rids]}}}
        for s, rids in steps.items()
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_waiting_tag_from_the_probe_names_the_first_lone_drop(tmp_path):
    _drops(tmp_path / "rank0.jsonl", {7: ["o035"], 9: ["o036"]})
    _drops(tmp_path / "rank1.jsonl", {8: ["o035"]})
    tag = run_tags(tmp_path)[WAITING]
    assert tag.step == 9 and "dropped o036 on rank 0 at step 9" in tag.says
    _drops(tmp_path / "rank1.jsonl", {8: ["o035"], 10: ["o036"]})
    assert run_tags(tmp_path) == {}  # the same requests dropped on both ranks
