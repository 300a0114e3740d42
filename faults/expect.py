"""A scenario's `[expect]` table: what its run must produce, checked by `run --check`
(docs/design.md §4).

```toml
[expect]
outcome = "crash"
form = "B"
culprit_rank = 1
source = "host-alloc"
```
Any subset of the four keys; a key left out is not checked. `form = "none"` expects no crash
form (an `ok` run, a latent divergence). `outcome` and `form` also take a list, any one of which
matches: a divergence whose ending depends on timing (`outcome = ["crash", "hang"]`, `form =
["A", "C"]`) is still checked for the divergence it must show. The values are the verdict's own
words, so a mismatch names both sides in the same vocabulary.

A divergence that happens in some trials, not all, states a rate instead of one run's outcome:
`trials = 10` with `rate_at_least = 0.5` (an affected release) or `rate_at_most = 0.0` (a fixed
one). Each trial "matches" when the keys above match its verdict; `run --check` runs the trials
and fails only when their 95% Wilson interval lies wholly on the wrong side of the stated rate
(`judge_rate`), so a claim is refuted by data, never by one unlucky run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hicache_diag.errors import UsageError
from hicache_diag.evidence.verdict import CrashForm, DivergenceSource, Outcome, Verdict

EXPECT_KEYS = ("outcome", "form", "culprit_rank", "source")
RATE_KEYS = ("trials", "rate_at_least", "rate_at_most")
MAX_TRIALS = 1000  # a rate check is a bench, not a soak
_NO_FORM = "none"


@dataclass(frozen=True, slots=True)
class Expectation:
    outcome: tuple[Outcome, ...] | None = None  # any one of them
    form: tuple[str, ...] | None = None  # CrashForm values or "none", any one of them
    culprit_rank: int | None = None
    source: DivergenceSource | None = None
    trials: int = 1
    rate_at_least: float | None = None
    rate_at_most: float | None = None

    def check_ranks(self, world_size: int, where: str) -> None:
        """An expected culprit outside the run's ranks can never match: bad input."""
        if self.culprit_rank is not None and self.culprit_rank >= world_size:
            raise UsageError(
                f"{where}: [expect] culprit_rank = {self.culprit_rank}, but the run has ranks "
                f"0-{world_size - 1}"
            )

    @property
    def is_rate(self) -> bool:
        return self.rate_at_least is not None or self.rate_at_most is not None

    def judge_rate(self, matched: int, decided: int, interval: tuple[float, float]) -> list[str]:
        """The rate claims the trials refute: `interval` (the 95% Wilson interval of
        matched/decided) lies wholly below `rate_at_least` or wholly above `rate_at_most`."""
        lo, hi = interval
        out = []
        if self.rate_at_least is not None and hi < self.rate_at_least:
            out.append(
                f"rate: expected at least {self.rate_at_least:g}, got {matched}/{decided} "
                f"(95% interval [{lo:.2f}, {hi:.2f}])"
            )
        if self.rate_at_most is not None and lo > self.rate_at_most:
            out.append(
                f"rate: expected at most {self.rate_at_most:g}, got {matched}/{decided} "
                f"(95% interval [{lo:.2f}, {hi:.2f}])"
            )
        return out

    def describe(self) -> str:
        """`outcome=crash form=B culprit_rank=1` in the file's own key order."""
        parts = [f"{key}={value}" for key, value in _verdict_keys(self)]
        if self.is_rate:
            parts.append(f"trials={self.trials}")
        if self.rate_at_least is not None:
            parts.append(f"rate_at_least={self.rate_at_least:g}")
        if self.rate_at_most is not None:
            parts.append(f"rate_at_most={self.rate_at_most:g}")
        return " ".join(parts)

    def undecided(self, verdict: Verdict) -> str | None:
        """Why `verdict` cannot be checked: it decided nothing (undecided, interrupted) and
        [expect] did not ask for that. Never a mismatch: the run says nothing either way."""
        if verdict.outcome not in (Outcome.UNDECIDED, Outcome.INTERRUPTED):
            return None
        if self.outcome is not None and verdict.outcome in self.outcome:
            return None
        return f"{verdict.outcome.value}: {verdict.signature or 'no verdict'}"

    def mismatches(self, verdict: Verdict) -> list[str]:
        """One `key: expected X, got Y` line per expected key the verdict does not match."""
        out = []
        if self.outcome is not None and verdict.outcome not in self.outcome:
            want = _one_of([o.value for o in self.outcome])
            out.append(f"outcome: expected {want}, got {verdict.outcome.value}")
        if self.form is not None:
            got = verdict.form.value if verdict.form else _NO_FORM
            if got not in self.form:
                out.append(f"form: expected {_one_of(list(self.form))}, got {got}")
        if self.culprit_rank is not None and verdict.culprit_rank != self.culprit_rank:
            out.append(f"culprit_rank: expected {self.culprit_rank}, got {verdict.culprit_rank}")
        if self.source is not None:
            fd = verdict.first_divergence
            got_source = fd.source.value if fd is not None else "none (no first divergence)"
            if fd is None or fd.source is not self.source:
                out.append(f"source: expected {self.source.value}, got {got_source}")
        return out


def _one_of(values: list[str]) -> str:
    return values[0] if len(values) == 1 else " or ".join(values)


def _listed(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else [value]


def _enum(enum_cls: Any, key: str, value: Any, where: str) -> Any:
    valid = [m.value for m in enum_cls]
    if not isinstance(value, str) or value not in valid:
        raise UsageError(f"{where}: {key} must be one of {', '.join(valid)} (got {value!r})")
    return enum_cls(value)


def parse_expect(table: Any, where: str) -> Expectation:
    """`[expect]` -> Expectation; unknown keys and bad values are one UsageError line."""
    if not isinstance(table, dict):
        raise UsageError(f"{where}: 'expect' must be a table, e.g. [expect] outcome = \"ok\"")
    unknown = sorted(set(table) - set(EXPECT_KEYS) - set(RATE_KEYS))
    if unknown:
        valid = ", ".join(EXPECT_KEYS + RATE_KEYS)
        raise UsageError(f"{where}: unknown [expect] key {unknown[0]!r}; valid: {valid}")
    if not set(table) & set(EXPECT_KEYS):
        raise UsageError(f"{where}: [expect] is empty; give any of {', '.join(EXPECT_KEYS)}")
    outcome = form = None
    if "outcome" in table:
        values = _listed(table["outcome"])
        outcome = tuple(_enum(Outcome, "outcome", v, where) for v in values) or None
        if outcome is None:
            raise UsageError(f"{where}: outcome = [] matches nothing; name one or more")
    if "form" in table:
        form = tuple(_enum_form(v, where) for v in _listed(table["form"])) or None
        if form is None:
            raise UsageError(f"{where}: form = [] matches nothing; name one or more")
    culprit = table.get("culprit_rank")
    if culprit is not None and (
        isinstance(culprit, bool) or not isinstance(culprit, int) or culprit < 0
    ):
        raise UsageError(f"{where}: culprit_rank must be a rank number >= 0 (got {culprit!r})")
    source = None
    if "source" in table:
        source = _enum(DivergenceSource, "source", table["source"], where)
    expect = Expectation(outcome, form, culprit, source, *_rates(table, where))
    _refuse_unsatisfiable(expect, where)
    return expect


# The forms a verdict of each outcome can carry (evidence/verdict.py): a hang is form C, a crash
# A, B or neither, every other outcome none. An outcome that names no rank has no culprit, and
# an `ok` run has no first divergence (a divergence makes it `diverged`).
_FORMS = {Outcome.CRASH: ("A", "B", _NO_FORM), Outcome.HANG: ("C",)}
_NAMES_NO_RANK = (Outcome.OK, Outcome.UNDECIDED, Outcome.INTERRUPTED)


def _refuse_unsatisfiable(e: Expectation, where: str) -> None:
    """An [expect] no verdict can ever match (`outcome = "ok"` with `form = "A"`): refused at
    parse time, naming the pair, instead of failing every run as a mismatch."""
    outcomes = e.outcome or tuple(Outcome)
    forms = e.form or (*[f.value for f in CrashForm], _NO_FORM)
    pairs = [(o, f) for o in outcomes for f in forms if f in _FORMS.get(o, (_NO_FORM,))]
    if e.culprit_rank is not None:
        pairs = [(o, f) for o, f in pairs if o not in _NAMES_NO_RANK]
    if e.source is not None:
        pairs = [(o, f) for o, f in pairs if o is not Outcome.OK]
    if pairs:
        return  # some verdict matches (a list may name a value only another key rules out)
    first = (e.outcome or tuple(Outcome))[0]
    raise UsageError(f"{where}: [expect] {_never(e)} can never match: {_why(first, e)}")


def _verdict_keys(e: Expectation) -> list[tuple[str, str | int]]:
    """The verdict keys an [expect] table sets, in the file's order, with their values."""
    keys: list[tuple[str, str | int]] = []
    if e.outcome is not None:
        keys.append(("outcome", _one_of([o.value for o in e.outcome])))
    if e.form is not None:
        keys.append(("form", _one_of(list(e.form))))
    if e.culprit_rank is not None:
        keys.append(("culprit_rank", e.culprit_rank))
    if e.source is not None:
        keys.append(("source", e.source.value))
    return keys


def _never(e: Expectation) -> str:
    return " with ".join(f"{key} = {value!r}" for key, value in _verdict_keys(e))


def _why(outcome: Outcome, e: Expectation) -> str:
    forms = _FORMS.get(outcome, (_NO_FORM,))
    if e.form is not None and not set(e.form) & set(forms):
        return "form C is a hang's, A and B a crash's, every other outcome has none"
    if e.culprit_rank is not None and outcome in _NAMES_NO_RANK:
        return f"a verdict of {outcome.value} names no rank"
    return f"a verdict of {outcome.value} has no first divergence"


def _rates(table: dict[str, Any], where: str) -> tuple[int, float | None, float | None]:
    """`trials`, `rate_at_least`, `rate_at_most`: a rate needs trials > 1 and trials a rate."""
    trials = table.get("trials", 1)
    if isinstance(trials, bool) or not isinstance(trials, int) or not 1 <= trials <= MAX_TRIALS:
        raise UsageError(f"{where}: trials must be an integer from 1 to {MAX_TRIALS} ({trials!r})")
    rates = []
    for key in ("rate_at_least", "rate_at_most"):
        value = table.get(key)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1
        ):
            raise UsageError(f"{where}: {key} must be a number from 0 to 1 (got {value!r})")
        rates.append(None if value is None else float(value))
    low, high = rates
    if low is not None and high is not None and low > high:
        raise UsageError(
            f"{where}: rate_at_least = {low:g} and rate_at_most = {high:g} contradict: no rate "
            "is both"
        )
    if (low is not None and low == 0 and high is None) or (high == 1 and low is None):
        which = "rate_at_least = 0" if low == 0 else "rate_at_most = 1"
        raise UsageError(f"{where}: {which} holds for every rate: it checks nothing")
    if (trials > 1) != any(r is not None for r in rates):
        raise UsageError(
            f"{where}: a rate needs trials > 1 and trials > 1 needs a rate "
            "(e.g. trials = 10 with rate_at_least = 0.5, or rate_at_most = 0.0)"
        )
    return trials, rates[0], rates[1]


def _enum_form(value: Any, where: str) -> str:
    valid = [m.value for m in CrashForm] + [_NO_FORM]
    if not isinstance(value, str) or value not in valid:
        raise UsageError(f"{where}: form must be one of {', '.join(valid)} (got {value!r})")
    return value
