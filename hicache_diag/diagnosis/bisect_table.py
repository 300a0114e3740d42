"""Bisect results: per-cell crash rates with Wilson intervals, and the verdict lines
(docs/design.md §6)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hicache_diag.diagnosis.stats import median_ttf, wilson
from hicache_diag.options.release_order import release_key

BISECT_SCHEMA = "hicache-diag/bisect/v1"
STORAGE_AXIS = "storage-backend"
HOST_AXIS = "hicache-size"
RELEASE_AXIS = "sglang-python"  # one SGLang release per value (its interpreter)


UNDECIDED = "undecided"


@dataclass(frozen=True, slots=True)
class BisectTrial:
    seed: int
    run_dir: str
    # The verdict's outcome; "undecided" when the trial decided nothing (`cause`, `error`).
    outcome: str | None
    form: str | None = None
    duration_s: float | None = None
    error: str | None = None  # why it decided nothing, in full (one line)
    # The short reason shown in every table: the tool's own limit ("trial timeout 300s", "step
    # budget"), "interrupted" or "no verdict"; never counted as a pass or a failure.
    cause: str | None = None

    @property
    def decided(self) -> bool:
        return self.outcome not in (None, UNDECIDED)

    @property
    def failed(self) -> bool:
        return self.decided and self.outcome != "ok"


def undecided_trial(seed: int, run_dir: str, cause: str, error: str) -> BisectTrial:
    return BisectTrial(seed, run_dir, UNDECIDED, error=error, cause=cause)


def causes_text(causes: dict[str, int]) -> str:
    """`trial timeout 0.001s: 4, step budget: 1`"""
    return ", ".join(f"{cause}: {n}" for cause, n in causes.items())


@dataclass(slots=True)
class Cell:
    values: dict[str, str]
    results: list[BisectTrial] = field(default_factory=list)

    @property
    def trials(self) -> int:
        """Trials that finished with a verdict: the only ones a rate counts."""
        return sum(1 for r in self.results if r.decided)

    @property
    def failures(self) -> int:
        return sum(1 for r in self.results if r.failed)

    @property
    def undecided(self) -> int:
        return sum(1 for r in self.results if not r.decided)

    @property
    def rate(self) -> float:
        return self.failures / self.trials if self.trials else 0.0

    def causes(self) -> dict[str, int]:
        found = Counter(r.cause or "no verdict" for r in self.results if not r.decided)
        return dict(found.most_common())

    def to_json(self) -> dict[str, Any]:
        lo, hi = wilson(self.failures, self.trials)
        forms = Counter(r.form or r.outcome for r in self.results if r.failed)
        return {
            "values": dict(self.values),
            "trials": self.trials,
            "failures": self.failures,
            "undecided": self.undecided,
            "undecided_causes": self.causes(),
            "rate": round(self.rate, 4),
            "ci95": [round(lo, 4), round(hi, 4)],
            "forms": dict(sorted(forms.items())),
            "median_ttf_s": median_ttf(r.duration_s for r in self.results if r.failed),
            "run_dirs": [r.run_dir for r in self.results],
            "errors": [f"{r.run_dir}: {r.error}" for r in self.results if r.error],
        }


def _pooled(cells: list[Cell], axis: str) -> dict[str, tuple[int, int]]:
    """value -> (failures, trials) pooled over every other axis."""
    pooled: dict[str, tuple[int, int]] = {}
    for c in cells:
        if axis in c.values:
            f, t = pooled.get(c.values[axis], (0, 0))
            pooled[c.values[axis]] = (f + c.failures, t + c.trials)
    return pooled


def _pct(f: int, t: int) -> str:
    return f"{f}/{t}" + (f" ({100 * f / t:.0f}%)" if t else "")


def _apart(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """The two rates' 95% Wilson intervals do not overlap: only then is a difference stated."""
    (alo, ahi), (blo, bhi) = wilson(*a), wilson(*b)
    return ahi < blo or bhi < alo


def _overlap_line(what: str, groups: str) -> str:
    return f"{what} {groups}: the 95% intervals overlap, no conclusion yet (raise --trials)"


def _storage_line(cells: list[Cell]) -> str | None:
    pooled = _pooled(cells, STORAGE_AXIS)
    f, t = pooled.get("none", (0, 0))
    if f:
        return (
            f"failures with no storage backend ({_pct(f, t)}): L2-dimension divergence "
            "(L1<->L2 acks, host pool), not L3"
        )
    others = {v: ft for v, ft in pooled.items() if v != "none" and ft[0]}
    if "none" in pooled and others:
        v, (f2, t2) = next(iter(others.items()))
        if not _apart((f2, t2), (f, t)):
            return _overlap_line("storage backend", f"({v}: {_pct(f2, t2)} vs none: {_pct(f, t)})")
        return f"failures only with storage backend {v} ({_pct(f2, t2)}): L3-dimension divergence"
    return None


def _size_key(value: str) -> float:
    from hicache_diag.options.sizes import parse_size

    try:
        return float(parse_size(value))
    except Exception:  # noqa: BLE001 - an unparsable size sorts last rather than failing
        return float("inf")


def _host_line(cells: list[Cell]) -> str | None:
    pooled = _pooled(cells, HOST_AXIS)
    if len(pooled) < 2:
        return None
    order = sorted(pooled, key=_size_key)
    (fs, ts), (fl, tl) = pooled[order[0]], pooled[order[-1]]
    if not ts or not tl or (fs == 0 and fl == 0):
        return None
    small, large = fs / ts, fl / tl
    both = f"({order[0]}: {_pct(fs, ts)} vs {order[-1]}: {_pct(fl, tl)})"
    if not _apart((fs, ts), (fl, tl)):
        return _overlap_line("host size", both)
    if small < large:
        return f"rate falls with a smaller host size {both}: eviction-pressure related"
    if small > large:
        return f"rate rises with a smaller host size {both}: host-capacity pressure"
    return f"host size does not change the rate {both}"


def _release_line(cells: list[Cell], releases: dict[str, str]) -> str | None:
    """Where along the releases (in version order when known, else as given) the failure rate
    changes: the split into earlier and later releases whose pooled rates are furthest apart,
    stated only when their 95% intervals do not overlap."""
    pooled = _pooled(cells, RELEASE_AXIS)
    if len(pooled) < 2 or not any(f for f, _ in pooled.values()):
        return None
    order = list(pooled)
    if all(v in releases for v in order):
        order.sort(key=lambda v: release_key(releases[v]))
    name = [releases.get(v, v) for v in order]
    best = None
    for i in range(1, len(order)):
        before = tuple(map(sum, zip(*(pooled[v] for v in order[:i]), strict=True)))
        after = tuple(map(sum, zip(*(pooled[v] for v in order[i:]), strict=True)))
        if not before[1] or not after[1] or before[0] * after[1] == after[0] * before[1]:
            continue
        (blo, bhi), (alo, ahi) = wilson(*before), wilson(*after)
        gap = max(blo - ahi, alo - bhi)
        if best is None or gap > best[0]:
            best = (gap, i, before, after)
    if best is None:
        return f"release: the same failure rate in every release ({', '.join(name)})"
    gap, i, before, after = best
    span = name[0] if i == 1 else f"{name[0]}..{name[i - 1]}"
    later = name[i] if i == len(name) - 1 else f"{name[i]}..{name[-1]}"
    both = f"({span}: {_pct(*before)} vs {later}: {_pct(*after)})"
    if gap <= 0:
        return _overlap_line(f"release (largest change at {name[i]})", both)
    moves = "drops" if after[0] * before[1] < before[0] * after[1] else "rises"
    return f"first release where the failure rate {moves}: {name[i]} {both}"


def _switch_lines(cells: list[Cell], axes: list[str], describe) -> list[str]:
    lines = []
    for axis in axes:
        if axis in (STORAGE_AXIS, HOST_AXIS, RELEASE_AXIS):
            continue
        pooled = _pooled(cells, axis)
        clean = [v for v, (f, t) in pooled.items() if t and f == 0]
        dirty = {v: ft for v, ft in pooled.items() if ft[0]}
        if clean and dirty:
            bad = ", ".join(f"{v}: {_pct(*ft)}" for v, ft in dirty.items())
            ok = (0, sum(pooled[v][1] for v in clean))
            if all(_apart(ok, ft) for ft in dirty.values()):
                lines.append(
                    f"{axis}={'/'.join(clean)} removes all failures ({bad} otherwise)"
                    + describe(axis)
                )
            else:
                lines.append(_overlap_line(axis, f"({'/'.join(clean)}: {_pct(*ok)} vs {bad})"))
    return lines


@dataclass(slots=True)
class BisectTable:
    switches: list[str]
    cells: list[Cell]
    interrupted: bool = False
    describe: Any = field(default=lambda axis: "", repr=False)  # axis -> " : the fix is ..."
    releases: dict[str, str] = field(default_factory=dict)  # sglang-python value -> version

    @property
    def total_trials(self) -> int:
        return sum(c.trials for c in self.cells)

    @property
    def total_undecided(self) -> int:
        return sum(c.undecided for c in self.cells)

    def causes(self) -> dict[str, int]:
        total: Counter[str] = Counter()
        for c in self.cells:
            total.update(c.causes())
        return dict(total.most_common())

    @property
    def concluded(self) -> bool:
        """Some trial finished: without one there is nothing to conclude from (a Ctrl-C before
        the first trial ended concludes nothing, never "no failures in 0 trials")."""
        return self.total_trials > 0

    @property
    def exit_code(self) -> int:
        """130 interrupted; 3 (undecided) when no trial finished; else 0, whatever it found."""
        if self.interrupted:
            return 130
        return 0 if self.concluded else 3

    def _undecided_lines(self) -> list[str]:
        n = self.total_undecided
        if not n:
            return []
        why = causes_text(self.causes())
        if not self.concluded:
            return [
                f"no trial finished: nothing concluded ({n} undecided: {why}); raise "
                "--trial-timeout (or --max-steps) until trials end with a verdict"
            ]
        return [
            f"{n} of {n + self.total_trials} trials undecided ({why}): the rates count only "
            f"the {self.total_trials} that finished"
        ]

    def verdict(self) -> list[str]:
        lines = self._undecided_lines()
        if not self.concluded:
            return lines + (["interrupted: partial table"] if self.interrupted else [])
        failures = sum(c.failures for c in self.cells)
        if failures == 0:
            lines.append(f"no failures in {self.total_trials} trials")
        lines += [
            x
            for x in (
                _storage_line(self.cells),
                _host_line(self.cells),
                _release_line(self.cells, self.releases),
            )
            if x
        ]
        lines += _switch_lines(self.cells, self.switches, self.describe)
        if failures and not lines:
            lines.append(
                f"{failures}/{self.total_trials} trials failed and no axis here removes the "
                "failures: vary a protocol switch (--switch NAME=legacy,fixed)"
            )
        if self.interrupted:
            lines.append("interrupted: partial table")
        return lines

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": BISECT_SCHEMA,
            "switches": list(self.switches),
            "cells": [c.to_json() for c in self.cells],
            "verdict": self.verdict(),
            "concluded": self.concluded,
            "undecided": self.total_undecided,
            "undecided_causes": self.causes(),
            "interrupted": self.interrupted,
            **({"releases": dict(self.releases)} if self.releases else {}),
        }
