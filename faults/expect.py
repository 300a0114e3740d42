"""A scenario's `[expect]` table: what its run must produce, checked by `run --check` (DESIGN §4).

```toml
[expect]
outcome = "crash"
form = "B"
culprit_rank = 1
source = "host-alloc"
```
Any subset of the four keys; a key left out is not checked. `form = "none"` expects no crash
form (an `ok` run, a latent divergence). The values are the verdict's own words, so a mismatch
names both sides in the same vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hicache_diag.errors import UsageError
from hicache_diag.verdict import CrashForm, DivergenceSource, Outcome, Verdict

EXPECT_KEYS = ("outcome", "form", "culprit_rank", "source")
_NO_FORM = "none"


@dataclass(frozen=True, slots=True)
class Expectation:
    outcome: Outcome | None = None
    form: CrashForm | None = None
    no_form: bool = False  # `form = "none"`: the verdict must carry no crash form
    culprit_rank: int | None = None
    source: DivergenceSource | None = None

    def describe(self) -> str:
        """`outcome=crash form=B culprit_rank=1` in the file's own key order."""
        parts = []
        if self.outcome is not None:
            parts.append(f"outcome={self.outcome.value}")
        if self.form is not None or self.no_form:
            parts.append(f"form={self.form.value if self.form else _NO_FORM}")
        if self.culprit_rank is not None:
            parts.append(f"culprit_rank={self.culprit_rank}")
        if self.source is not None:
            parts.append(f"source={self.source.value}")
        return " ".join(parts)

    def mismatches(self, verdict: Verdict) -> list[str]:
        """One `key: expected X, got Y` line per expected key the verdict does not match."""
        out = []
        if self.outcome is not None and verdict.outcome is not self.outcome:
            out.append(f"outcome: expected {self.outcome.value}, got {verdict.outcome.value}")
        if self.form is not None or self.no_form:
            got = verdict.form.value if verdict.form else _NO_FORM
            want = self.form.value if self.form else _NO_FORM
            if got != want:
                out.append(f"form: expected {want}, got {got}")
        if self.culprit_rank is not None and verdict.culprit_rank != self.culprit_rank:
            out.append(f"culprit_rank: expected {self.culprit_rank}, got {verdict.culprit_rank}")
        if self.source is not None:
            fd = verdict.first_divergence
            got_source = fd.source.value if fd is not None else "none (no first divergence)"
            if fd is None or fd.source is not self.source:
                out.append(f"source: expected {self.source.value}, got {got_source}")
        return out


def _enum(enum_cls: Any, key: str, value: Any, where: str) -> Any:
    valid = [m.value for m in enum_cls]
    if not isinstance(value, str) or value not in valid:
        raise UsageError(f"{where}: {key} must be one of {', '.join(valid)} (got {value!r})")
    return enum_cls(value)


def parse_expect(table: Any, where: str) -> Expectation:
    """`[expect]` -> Expectation; unknown keys and bad values are one UsageError line."""
    if not isinstance(table, dict):
        raise UsageError(f"{where}: 'expect' must be a table, e.g. [expect] outcome = \"ok\"")
    unknown = sorted(set(table) - set(EXPECT_KEYS))
    if unknown:
        raise UsageError(
            f"{where}: unknown [expect] key {unknown[0]!r}; valid: {', '.join(EXPECT_KEYS)}"
        )
    if not table:
        raise UsageError(f"{where}: [expect] is empty; give any of {', '.join(EXPECT_KEYS)}")
    outcome = _enum(Outcome, "outcome", table["outcome"], where) if "outcome" in table else None
    form, no_form = None, False
    if "form" in table:
        if table["form"] == _NO_FORM:
            no_form = True
        else:
            form = _enum_form(table["form"], where)
    culprit = table.get("culprit_rank")
    if culprit is not None and (
        isinstance(culprit, bool) or not isinstance(culprit, int) or culprit < 0
    ):
        raise UsageError(f"{where}: culprit_rank must be a rank number >= 0 (got {culprit!r})")
    source = None
    if "source" in table:
        source = _enum(DivergenceSource, "source", table["source"], where)
    return Expectation(outcome, form, no_form, culprit, source)


def _enum_form(value: Any, where: str) -> CrashForm:
    valid = [m.value for m in CrashForm] + [_NO_FORM]
    if not isinstance(value, str) or value not in valid:
        raise UsageError(f"{where}: form must be one of {', '.join(valid)} (got {value!r})")
    return CrashForm(value)
