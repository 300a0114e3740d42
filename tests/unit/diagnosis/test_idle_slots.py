"""The first divergence of real SGLang runs whose stages parted in a slot one of them ran idle
(folded into `idle_polls`, or, for a hung PP follower waiting for a request list, never written):
the committed runs, read from their files, and the rules on synthetic lines."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from hicache_diag.diagnosis.classify import classify_run
from hicache_diag.diagnosis.divergence import first_divergence
from hicache_diag.diagnosis.idle_slots import ran_past_last_line
from hicache_diag.diagnosis.load import load_run
from hicache_diag.evidence.stacks import Frame, RankDump, ThreadStack
from hicache_diag.evidence.verdict import DivergenceSource, Outcome

from .builder import step_record

ROOT = Path(__file__).resolve().parents[3]
SESSIONS = ROOT / "samples" / "hunt" / "sglang-0.5.23-sessions" / "runs"
HUNT = ROOT / "samples" / "hunt" / "sglang-0.5.23" / "runs"
RUNS = ROOT / "samples" / "runs"
SESSION = DivergenceSource.SESSION_CLOCK

# run dir -> (step, field, values per rank, source, culprit rank): natural (no-fault) runs on
# 0.5.23 whose recorded lines at the parting step come from one stage only.
COMMITTED = {
    SESSIONS / "session-close": (2383, "evicted", {"0": 0, "1": 96}, SESSION, 1),
    SESSIONS / "session-timeout": (2568, "rids", {"0": ["s000-t2"], "1": []}, SESSION, 0),
    HUNT / "session-close": (641, "evicted", {"0": 0, "1": 96}, SESSION, 1),
    HUNT / "session-timeout": (421, "evicted", {"0": 0, "1": 80}, SESSION, 1),
    RUNS / "sglang-0.5.18-l3-no-fault": (
        114,
        "rids",
        {"0": [], "1": ["r0001"]},
        DivergenceSource.UNKNOWN,
        1,
    ),
}


@pytest.mark.parametrize(
    "run_dir", list(COMMITTED), ids=lambda p: f"{p.parent.parent.name}/{p.name}"
)
def test_committed_runs_name_the_slot_the_stages_parted_in(run_dir: Path) -> None:
    step, field, values, source, culprit = COMMITTED[run_dir]
    verdict = classify_run(run_dir)
    fd = verdict.first_divergence
    assert fd is not None, "the stages ran different batches at an aligned slot"
    assert (fd.step, fd.field, fd.values, fd.source) == (step, field, values, source)
    assert verdict.culprit_rank == culprit
    assert any("ran no batch (an idle slot the recorder folded)" in e for e in verdict.evidence)


def test_the_hung_followers_last_slots_come_from_its_stack() -> None:
    run = load_run(SESSIONS / "session-timeout")
    assert ran_past_last_line(run.frames, run.stacks) == {1: 2568}  # PP1 wrote 2406 last
    assert first_divergence(run.frames) is None  # without the stack: nothing says it ran 2568
    verdict = classify_run(SESSIONS / "session-timeout")
    assert any("at the hang it waited for a request list" in e for e in verdict.evidence)


@pytest.mark.parametrize("name", ["healthy", "sglang-0.5.23-dma-delay"])
def test_committed_healthy_runs_have_no_divergence(name: str) -> None:
    verdict = classify_run(RUNS / name)
    assert verdict.outcome is Outcome.OK and verdict.first_divergence is None


def _line(rank: int, step: int, **over) -> dict:
    return step_record(rank, step, write_backs=0, acks_consumed={"write": 0, "load": 0}, **over)


def _frames(lines: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(lines).sort_values(["step", "rank"], kind="stable")


def test_idle_lines_at_different_steps_are_no_divergence() -> None:
    # Each rank folds its idle slots and heartbeats on its own second: equal batches, else idle.
    lines = [_line(r, s, idle_polls=0) for r in (0, 1) for s in (1, 2)]
    lines += [_line(0, 9, rids=[], idle=True, must_agree=[], idle_polls=6)]
    lines += [_line(1, 11, rids=[], idle=True, must_agree=[], idle_polls=8)]
    lines += [_line(r, 20, idle_polls=10 if r == 0 else 8, tree_digest="d") for r in (0, 1)]
    assert first_divergence(_frames(lines)) is None


def test_a_batch_against_a_folded_slot_is_a_divergence() -> None:
    lines = [_line(r, 1, idle_polls=0) for r in (0, 1)]
    lines += [_line(1, 3, idle_polls=1, evicted=40), _line(0, 4, idle_polls=2)]
    d = first_divergence(_frames(lines))
    assert d is not None
    assert (d.first.step, d.first.field, d.first.values) == (3, "evicted", {"0": 0, "1": 40})


def test_a_rank_past_its_last_line_is_never_assumed_idle() -> None:
    # Rank 1 stopped writing at step 1 (crashed, hung, killed): its step 3 is unknown, not idle.
    lines = [_line(r, 1, idle_polls=0) for r in (0, 1)] + [_line(0, 3, idle_polls=1)]
    assert first_divergence(_frames(lines)) is None
    assert first_divergence(_frames(lines), ran_to={1: 3}) is not None


def _waiting_in(*names: str) -> RankDump:
    frames = tuple(Frame(n, "scheduler.py", 1) for n in names)
    return RankDump(None, None, None, [ThreadStack("MainThread", True, frames)], "t")


def test_only_a_follower_waiting_for_requests_runs_past_its_last_line() -> None:
    lines = [_line(r, 1, idle_polls=0) for r in (0, 1)] + [_line(0, 3, idle_polls=1)]
    frames = _frames(lines)
    recv = _waiting_in("point_to_point_pyobj", "_pull_raw_reqs", "recv_requests")
    proxy = _waiting_in("recv_tensor_dict", "_pp_recv_proxy_tensors", "event_loop_pp")
    assert ran_past_last_line(frames, {1: recv}) == {1: 3}
    assert ran_past_last_line(frames, {1: proxy}) == {}
    assert ran_past_last_line(frames, {0: recv}) == {}  # PP0 receives from the tokenizer


@pytest.mark.parametrize(
    ("name", "step", "culprit"),
    [
        ("sglang-0.5.23-session-close", 384, 0),
        ("sglang-0.5.23-session-close-sources", 244, 1),
        ("sglang-0.5.23-session-timeout", 155, 1),
    ],
)
def test_a_reap_on_one_rank_only_is_the_session_clock(name: str, step: int, culprit: int) -> None:
    # Both stages wrote the parting step here; the source is the rank whose own tick closed.
    fd = first_divergence(load_run(RUNS / name).frames)
    assert fd is not None and fd.first.step == step
    assert fd.first.source is SESSION and fd.culprit_rank == culprit
