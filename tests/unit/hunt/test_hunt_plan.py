"""The hunt's plan: which trigger pulls which unaligned read, budgets, and what an engine cannot
take (refused by the run options' own parser, so the hunt moves on)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from hicache_diag.cli.hunt import parse_budget
from hicache_diag.engines.builtin.options import BuiltinOptions
from hicache_diag.engines.sglang.options import SglangOptions
from hicache_diag.errors import UsageError
from hicache_diag.hunt.plan import plan_hunt
from hicache_diag.hunt.run import variant_options
from hicache_diag.hunt.triggers import FLUSH_DEADLINE, SESSION_CLOSE, WAITING_TIMEOUT


@dataclass(frozen=True)
class _Alignment:
    mechanism: str
    covers_pp: bool | None = None


@dataclass(frozen=True)
class _Read:
    kind: str
    decisions: tuple[str, ...]
    mechanism: str = "none"
    file: str = "managers/scheduler.py"
    line: int = 1
    function: str = "f"
    covers_pp: bool | None = None

    @property
    def alignment(self) -> _Alignment:
        return _Alignment(self.mechanism, self.covers_pp)


def test_unaligned_reads_group_under_their_trigger_and_the_rest_are_listed():
    reads = [
        _Read("clock", ("session-release",), line=10),
        _Read("clock", ("session-release",), line=11),
        _Read("clock", ("request-abort",), line=20),
        _Read("clock", ("request-abort",), mechanism="leader-decision", line=21),  # aligned
        _Read("thread-value", ("unknown",), line=30),
    ]
    candidates, unmapped = plan_hunt(reads)
    names = [c.trigger.name for c in candidates]
    assert names[:2] == ["session-close", "session-timeout"]  # two reads each: first
    assert "overload-waiting-timeout" in names
    waiting = next(c for c in candidates if c.trigger is WAITING_TIMEOUT)
    assert waiting.sources == ("managers/scheduler.py:20 f (clock -> request-abort)",)
    assert unmapped == ["managers/scheduler.py:30 f (thread-value -> unknown)"]


def test_a_collective_inside_one_stage_does_not_align_the_stages():
    # 0.5.18's L3 drain: a MIN over each stage's own TP group (covers_pp False) is a candidate;
    # the same MIN relayed down PP (covers_pp True) is not; unknown coverage is not guessed at.
    drain = ("queue-size", ("storage-queue-drain",))
    reads = [
        _Read(*drain, mechanism="min", covers_pp=False, line=1561),
        _Read(*drain, mechanism="min+leader-relay", covers_pp=True, line=1006),
        _Read(*drain, mechanism="min", covers_pp=None, line=7),
    ]
    candidates, _ = plan_hunt(reads)
    assert [c.trigger.name for c in candidates] == ["l3-storage"]
    assert candidates[0].sources == (
        "managers/scheduler.py:1561 f (queue-size -> storage-queue-drain)",
    )


def test_a_trigger_the_engine_cannot_take_is_refused_by_the_options_parser():
    with pytest.raises(UsageError, match="use --engine sglang"):
        variant_options(BuiltinOptions(), SESSION_CLOSE.variants[0])
    with pytest.raises(UsageError, match="use --engine sglang"):
        variant_options(BuiltinOptions(), WAITING_TIMEOUT.variants[0])
    sglang_only = type(WAITING_TIMEOUT.variants[0])({"sglang_env": ["A=1"]})
    with pytest.raises(UsageError, match="not a run option of --engine builtin"):
        variant_options(BuiltinOptions(), sglang_only)
    sglang = variant_options(SglangOptions(), WAITING_TIMEOUT.variants[0])
    assert sglang.workload == "overload" and sglang.requests == 96
    assert sglang.server_env() == (("SGLANG_REQ_WAITING_TIMEOUT", "1.5"),)
    flush = variant_options(SglangOptions(), FLUSH_DEADLINE.variants[1])
    assert flush.faults == ("flush-clock:rank=1,offset-ms=3000",)


@pytest.mark.parametrize(
    ("text", "want"),
    [("20", (20, None)), ("45s", (None, 45.0)), ("60m", (None, 3600.0)), ("2h", (None, 7200.0))],
)
def test_budget_is_trials_or_wall_time(text, want):
    assert parse_budget(text) == want


@pytest.mark.parametrize("text", ["0", "-3", "1.5", "ten", "5d", ""])
def test_bad_budget_is_one_line(text):
    with pytest.raises(UsageError, match="--budget"):
        parse_budget(text)
