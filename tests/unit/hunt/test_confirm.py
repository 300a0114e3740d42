"""The hunt's confirming reruns: up to CONFIRM_TRIES fresh reruns until one fails again; an
undecided rerun (the environment failed) neither confirms nor refutes; refuted only when every
decided rerun passed, unknown when none decided."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hicache_diag.evidence.verdict import Outcome
from hicache_diag.hunt import run as hunt_run
from hicache_diag.hunt.model import TriggerResult


@pytest.mark.parametrize(
    ("outcomes", "confirmed", "reruns"),
    [
        ([Outcome.CRASH], True, ["crash"]),
        ([Outcome.OK, Outcome.OK, Outcome.OK], False, ["ok"] * 3),
        ([Outcome.OK, Outcome.CRASH], True, ["ok", "crash"]),
        ([Outcome.UNDECIDED, Outcome.CRASH], True, ["undecided", "crash"]),
        ([Outcome.UNDECIDED, Outcome.UNDECIDED, Outcome.OK], False, ["undecided"] * 2 + ["ok"]),
        ([Outcome.UNDECIDED] * 3, None, ["undecided"] * 3),
    ],
)
def test_reruns_until_one_fails_and_undecided_is_never_a_pass(
    monkeypatch, tmp_path, outcomes, confirmed, reruns
):
    left = list(outcomes)
    monkeypatch.setattr(hunt_run, "_first_seed", lambda result: 7)
    monkeypatch.setattr(hunt_run, "_trials", lambda *a: ([SimpleNamespace()], False))
    monkeypatch.setattr(hunt_run, "trial_verdict", lambda run: SimpleNamespace(outcome=left.pop(0)))
    result = TriggerResult("session-close", "test", ())
    assert hunt_run._confirm(result, None, tmp_path) is confirmed
    assert result.reruns == reruns and not left


def test_the_table_says_unknown_when_every_rerun_was_undecided():
    from hicache_diag.cli.render.hunt import _status

    result = TriggerResult("session-close", "test", (), failures=2, trials=2)
    result.confirmed, result.reruns = None, ["undecided"] * 3
    assert "reruns were undecided (3): unknown" in _status(result)
    assert not result.divergent


def test_every_natural_trigger_runs_before_any_perturbation(monkeypatch, tmp_path):
    """A budget spent on one candidate's faults must not starve another's natural trigger; a
    candidate that diverged naturally gets no perturbation."""
    from hicache_diag.hunt.plan import Candidate
    from hicache_diag.hunt.triggers import Trigger, Variant

    ran: list[tuple[str, str]] = []

    def try_variant(result, cell, n, seed, out, ctx):
        ran.append((result.name, result.fault or "natural"))
        diverged = result.name == "b" and result.fault is None
        result.failures += diverged
        return diverged

    monkeypatch.setattr(hunt_run, "_try_variant", try_variant)
    monkeypatch.setattr(hunt_run, "variant_options", lambda base, v: SimpleNamespace(seed=0))
    monkeypatch.setattr("hicache_diag.engines.registry.build", lambda options: None)
    both = (Variant(), Variant({}, "f1"))
    cands = [
        Candidate(Trigger("a", "", both), ()),
        Candidate(Trigger("b", "", both), ()),
        Candidate(Trigger("c", "", (Variant({}, "f2"),)), ()),  # a perturbation only
    ]
    cfg = hunt_run.HuntConfig(base=None, trials=1, out=tmp_path)
    report = hunt_run.run_hunt(cfg, cands, "0.5.23")
    assert ran == [("a", "natural"), ("b", "natural"), ("a", "f1"), ("c", "f2")]
    assert [r.name for r in report.results] == ["a", "b", "c"]


def test_a_failure_stopped_before_its_rerun_says_so_not_zero_reruns():
    from hicache_diag.cli.render.hunt import _status

    result = TriggerResult("session-timeout", "test", (), failures=3, trials=3)
    result.confirmed, result.reruns = None, []
    assert _status(result) == "failed; not confirmed: no fresh rerun ran"
