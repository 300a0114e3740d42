"""Scenario [expect] tables: parsing, every bad table, and matching against verdicts."""

import pytest

from hicache_diag.errors import UsageError
from hicache_diag.evidence.verdict import (
    CrashForm,
    DivergenceSource,
    FirstDivergence,
    Outcome,
    Verdict,
)
from hicache_diag.faults import load_scenario
from hicache_diag.faults.expect import Expectation, parse_expect

FORM_B = Verdict(
    Outcome.CRASH,
    CrashForm.B,
    failed_rank=1,
    culprit_rank=1,
    signature="IndexError: pop from empty list",
    first_divergence=FirstDivergence(3, "host_free", {"0": 1, "1": 2}, DivergenceSource.HOST_ALLOC),
)


def test_scenario_carries_its_expectation(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(
        'pp = 2\n[expect]\noutcome = "crash"\nform = "B"\nculprit_rank = 1\nsource = "host-alloc"\n'
        '\n[[fault]]\nname = "host-alloc-fail"\nrank = 1\n'
    )
    sc = load_scenario(path)
    assert "expect" not in sc.options  # not a run option
    assert sc.expect.describe() == "outcome=crash form=B culprit_rank=1 source=host-alloc"
    assert sc.expect.mismatches(FORM_B) == []
    assert load_scenario(_write(tmp_path, "pp = 2\n")).expect is None


def _write(tmp_path, text):
    path = tmp_path / "other.toml"
    path.write_text(text)
    return path


def test_every_mismatch_is_named_in_the_verdicts_words():
    # no verdict matches all four (parse_expect refuses it: issue 41), so built directly
    exp = Expectation((Outcome.OK,), ("none",), 0, DivergenceSource.L3_HIT)
    assert exp.mismatches(FORM_B) == [
        "outcome: expected ok, got crash",
        "form: expected none, got B",
        "culprit_rank: expected 0, got 1",
        "source: expected l3-hit, got host-alloc",
    ]
    ok = Verdict(Outcome.OK)
    assert exp.mismatches(ok) == [
        "culprit_rank: expected 0, got None",
        "source: expected l3-hit, got none (no first divergence)",
    ]
    assert parse_expect({"form": "none"}, "x").mismatches(ok) == []
    assert parse_expect({"outcome": "crash"}, "x").mismatches(FORM_B) == []  # a subset checks


def test_a_list_matches_any_one_of_its_values():
    # A divergence whose ending depends on timing (0.5.12.post1's PP1 slow acks: crash A in 4
    # of 5 runs, hang C in 1) is checked for the divergence, ended either way.
    exp = parse_expect({"outcome": ["crash", "hang"], "form": ["A", "B"]}, "x")
    assert exp.describe() == "outcome=crash or hang form=A or B"
    assert exp.mismatches(FORM_B) == []
    assert exp.mismatches(Verdict(Outcome.OK)) == [
        "outcome: expected crash or hang, got ok",
        "form: expected A or B, got none",
    ]
    assert parse_expect({"form": ["none", "C"]}, "x").mismatches(Verdict(Outcome.OK)) == []


@pytest.mark.parametrize(
    ("table", "needle"),
    [
        ("[expect]\n", "[expect] is empty"),
        ("[expect]\nexit = 11\n", "unknown [expect] key 'exit'; valid: outcome, form"),
        ('[expect]\noutcome = "boom"\n', "outcome must be one of ok, crash, hang"),
        ('[expect]\nform = "D"\n', "form must be one of A, B, C, none (got 'D')"),
        ("[expect]\nform = 2\n", "form must be one of"),
        ("[expect]\nculprit_rank = -1\n", "culprit_rank must be a rank number >= 0"),
        ("[expect]\nculprit_rank = true\n", "culprit_rank must be a rank number"),
        ('[expect]\nsource = "dma"\n', "source must be one of dma-ack-count"),
        ('expect = "crash"\n', "'expect' must be a table"),
        ("[expect]\noutcome = []\n", "outcome = [] matches nothing"),
        ('[expect]\nform = ["A", "D"]\n', "form must be one of A, B, C, none (got 'D')"),
    ],
)
def test_bad_expect_is_one_line_naming_the_file(tmp_path, table, needle):
    path = _write(tmp_path, table)
    with pytest.raises(UsageError) as err:
        load_scenario(path)
    msg = str(err.value)
    assert needle in msg and str(path) in msg and "\n" not in msg


@pytest.mark.parametrize(
    ("table", "needle"),
    [
        ({"outcome": "ok", "trials": 3}, "a rate needs trials > 1 and trials > 1 needs a rate"),
        ({"outcome": "ok", "rate_at_least": 0.5}, "a rate needs trials > 1"),
        ({"outcome": "ok", "trials": 0, "rate_at_least": 0.5}, "trials must be an integer"),
        ({"outcome": "ok", "trials": 10**6, "rate_at_most": 0}, "from 1 to 1000"),
        ({"outcome": "ok", "trials": 3, "rate_at_most": 1.5}, "rate_at_most must be a number"),
        ({"trials": 3, "rate_at_most": 0.0}, "[expect] is empty"),
    ],
)
def test_bad_rate_tables_are_one_line(table, needle):
    with pytest.raises(UsageError, match=None) as err:
        parse_expect(table, "scenario 's.toml'")
    assert needle in str(err.value)


def test_a_rate_is_refuted_only_by_an_interval_wholly_on_the_wrong_side():
    from hicache_diag.diagnosis.stats import wilson

    least = parse_expect({"outcome": "diverged", "trials": 10, "rate_at_least": 0.5}, "s")
    assert least.is_rate and "trials=10 rate_at_least=0.5" in least.describe()
    assert least.judge_rate(7, 10, wilson(7, 10)) == []  # the 0.5.19 waiting timeout
    assert least.judge_rate(2, 10, wilson(2, 10)) == []  # [0.06, 0.51]: not refuted
    assert least.judge_rate(1, 10, wilson(1, 10))  # [0.02, 0.40]: below 0.5
    most = parse_expect({"outcome": "diverged", "trials": 10, "rate_at_most": 0.0}, "s")
    assert most.judge_rate(0, 10, wilson(0, 10)) == []  # the fixed release
    assert most.judge_rate(1, 10, wilson(1, 10))  # one divergence refutes "never"
