"""Score verdicts against the injected truth of a campaign: which trials can be
decided, whether outcome, form, culprit rank and divergence source are right, and the
confusion tables. Pure functions over plain records; `bench/accuracy.py` runs the trials.

A trial is decidable for culprit and source only when the truth is not ambiguous: exactly one
rank was perturbed, the fault fired, the same command without the fault (the control) ran
green, the fault has a source of its own (not a timing-only fault), and the run did not end
`ok` (a fault that changed nothing has no culprit). Form is scored on every run that crashed
or hung, against the process facts (launcher hang -> C, the first failing rank's error text).
Outcome is scored where the protocol's fix covers the fault: the verdict must then be `ok`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from campaign.plan import KINDS, Facts, TrialPlan
from hicache_diag.evidence.verdict import DivergenceSource

# Every source the classifier can name, `unknown` last (the confusion tables' order).
SOURCES = tuple(s.value for s in DivergenceSource if s is not DivergenceSource.UNKNOWN) + (
    DivergenceSource.UNKNOWN.value,
)


@dataclass(slots=True)
class Scored:
    """One trial: its plan, what really happened, the control's outcome and the verdict read
    from the blinded run directory (`outcome`, `form`, `culprit_rank`, `source`)."""

    plan: TrialPlan
    facts: Facts
    control: str | None
    verdict: dict[str, Any]
    same_as_unblinded: bool = True
    control_step: int | None = None  # the control's first divergence step, if it had one

    @property
    def expected_source(self) -> str | None:
        return KINDS[self.plan.kind][0]

    @property
    def ambiguous(self) -> str | None:
        """Why culprit and source cannot be scored, or None when they can."""
        plan, facts = self.plan, self.facts
        if len(plan.targets) > 1:
            return "two ranks perturbed"
        if self.control is None:
            return "control gave no verdict"
        if self.control != "ok":
            return "fails without the fault too"
        if not facts.fired_ranks:
            return "fault never fired"
        if self.verdict.get("outcome") in ("ok", None):
            return "fault never mattered (ok)"
        if self.expected_source is None:
            return "timing-only fault (no per-rank input of its own)"
        return None

    @property
    def fault_first(self) -> bool:
        """Ambiguous only because the control failed too, but this run diverged after the
        fault first fired and before the control did: probably the fault's doing (reported
        apart, never in the accuracy line)."""
        if self.ambiguous != "fails without the fault too" or self.expected_source is None:
            return False
        step, fired = self.verdict.get("step"), self.facts.first_fired_step
        if step is None or fired is None or self.control_step is None:
            return False
        return fired <= step < self.control_step

    @property
    def culprit_ok(self) -> bool:
        return self.verdict.get("culprit_rank") == self.plan.targets[0]

    @property
    def source_ok(self) -> bool:
        return self.verdict.get("source") == self.expected_source

    @property
    def form_truth(self) -> str | None:
        return self.facts.form

    @property
    def form_ok(self) -> bool:
        want = None if self.facts.form == "other" else self.facts.form
        return self.verdict.get("form") == want

    @property
    def outcome_scored(self) -> bool:
        return self.plan.absorbed() and self.control == "ok" and len(self.plan.targets) == 1


def verdict_fields(verdict: dict[str, Any]) -> dict[str, Any]:
    """The scored fields of a verdict JSON (docs/design.md §4)."""
    first = verdict.get("first_divergence") or {}
    return {
        "outcome": verdict.get("outcome"),
        "form": verdict.get("form"),
        "culprit_rank": verdict.get("culprit_rank"),
        "source": first.get("source"),
        "step": first.get("step"),
        "field": first.get("field"),
    }


@dataclass(slots=True)
class Summary:
    trials: int
    decidable: int
    culprit: int
    source: int
    form: int
    form_total: int
    outcome: int
    outcome_total: int
    ambiguous: Counter
    blinding_changed: int
    fault_first: int = 0
    ff_culprit: int = 0
    ff_source: int = 0

    def last_line(self) -> str:
        return (
            f"accuracy: culprit {self.culprit}/{self.decidable}, source {self.source}/"
            f"{self.decidable}, form {self.form}/{self.form_total}"
        )


def summarize(rows: list[Scored]) -> Summary:
    decidable = [r for r in rows if r.ambiguous is None]
    formed = [r for r in rows if r.form_truth is not None]
    outcome = [r for r in rows if r.outcome_scored]
    first = [r for r in rows if r.fault_first]
    return Summary(
        trials=len(rows),
        decidable=len(decidable),
        culprit=sum(r.culprit_ok for r in decidable),
        source=sum(r.source_ok for r in decidable),
        form=sum(r.form_ok for r in formed),
        form_total=len(formed),
        outcome=sum(r.verdict.get("outcome") == "ok" for r in outcome),
        outcome_total=len(outcome),
        ambiguous=Counter(r.ambiguous for r in rows if r.ambiguous is not None),
        blinding_changed=sum(not r.same_as_unblinded for r in rows),
        fault_first=len(first),
        ff_culprit=sum(r.culprit_ok for r in first),
        ff_source=sum(r.source_ok for r in first),
    )


def confusion(rows: list[Scored], truth: str) -> tuple[list[str], list[str], dict]:
    """(row labels, column labels, {(row, col): count}) for `truth` in source|form|outcome."""
    pick = {
        "source": (
            lambda r: r.ambiguous is None,
            lambda r: r.expected_source,
            lambda r: r.verdict.get("source") or "none",
        ),
        "form": (
            lambda r: r.form_truth is not None,
            lambda r: r.form_truth,
            lambda r: r.verdict.get("form") or "none",
        ),
        "outcome": (
            lambda r: r.outcome_scored,
            lambda r: "ok",
            lambda r: r.verdict.get("outcome") or "none",
        ),
    }[truth]
    keep, want, got = pick
    cells = Counter((want(r), got(r)) for r in rows if keep(r))
    rows_ = sorted({k[0] for k in cells}, key=_order)
    cols = sorted({k[1] for k in cells}, key=_order)
    return rows_, cols, dict(cells)


def _order(label: str) -> tuple[int, str]:
    known = (*SOURCES, "A", "B", "C", "other", "ok", "crash", "hang", "diverged", "none")
    return (known.index(label) if label in known else len(known), label)


def by_kind(rows: list[Scored]) -> list[tuple[str, int, int, int, int]]:
    """Per fault kind: (kind, trials, decidable, culprit right, source right)."""
    out = []
    for kind in KINDS:
        mine = [r for r in rows if r.plan.kind == kind]
        dec = [r for r in mine if r.ambiguous is None]
        if mine:
            out.append(
                (
                    kind,
                    len(mine),
                    len(dec),
                    sum(r.culprit_ok for r in dec),
                    sum(r.source_ok for r in dec),
                )
            )
    return out
