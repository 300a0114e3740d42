import json

import pytest

from hicache_diag.evidence.verdict import (
    CrashForm,
    DivergenceSource,
    ExitCode,
    FirstDivergence,
    Outcome,
    RankState,
    Verdict,
    exit_code_for,
    write_json_atomic,
)


def test_exit_codes_are_the_design_table():
    assert {c.name: int(c) for c in ExitCode} == {
        "OK": 0,
        "INTERNAL_ERROR": 1,
        "BAD_INPUT": 2,
        "UNDECIDED": 3,
        "CHECK_MISMATCH": 4,
        "FORM_A": 10,
        "FORM_B": 11,
        "FORM_C": 12,
        "DIVERGED": 13,
        "WRONG_OUTPUT": 14,
        "LEAK": 15,
        "CRASH_OTHER": 16,
        "INTERRUPTED": 130,
    }


@pytest.mark.parametrize(
    ("outcome", "form", "code"),
    [
        (Outcome.OK, None, 0),
        (Outcome.CRASH, CrashForm.A, 10),
        (Outcome.CRASH, CrashForm.B, 11),
        (Outcome.HANG, CrashForm.C, 12),
        (Outcome.HANG, None, 12),
        (Outcome.DIVERGED, None, 13),
        (Outcome.WRONG_OUTPUT, None, 14),
        (Outcome.LEAK, None, 15),
        (Outcome.CRASH, None, 16),
        (Outcome.INTERRUPTED, None, 130),
        (Outcome.UNDECIDED, None, 3),
    ],
)
def test_exit_code_for(outcome, form, code):
    assert exit_code_for(outcome, form) == code


def test_verdict_round_trips_through_json(tmp_path):
    v = Verdict(
        outcome=Outcome.CRASH,
        form=CrashForm.A,
        failed_rank=1,
        culprit_rank=0,
        signature="RuntimeError: shape '[12, -1, 16]' is invalid for input of size 512",
        first_divergence=FirstDivergence(
            3, "extend_num_tokens", {"0": 8, "1": 12}, DivergenceSource.DMA_ACK_COUNT
        ),
        ranks=[RankState(rank=0, pp=0, tp=0, pid=11, state="exited")],
        seed=7,
    )
    data = v.to_json()
    assert data["schema"] == "hicache-diag/verdict/v1"
    assert data["form"] == "A" and data["exit_code"] == 10
    assert data["first_divergence"]["source"] == "dma-ack-count"
    path = tmp_path / "verdict.json"
    write_json_atomic(path, data)
    back = Verdict.from_json(json.loads(path.read_text()))
    assert back == v
    assert not [p for p in tmp_path.iterdir() if p.name != "verdict.json"]
