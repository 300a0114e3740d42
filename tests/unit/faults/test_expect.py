"""Scenario [expect] tables: parsing, every bad table, and matching against verdicts."""

import pytest

from hicache_diag.errors import UsageError
from hicache_diag.faults import load_scenario
from hicache_diag.faults.expect import parse_expect
from hicache_diag.verdict import (
    CrashForm,
    DivergenceSource,
    FirstDivergence,
    Outcome,
    Verdict,
)

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
    table = {"outcome": "ok", "form": "none", "culprit_rank": 0, "source": "l3-hit"}
    exp = parse_expect(table, "x")
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
