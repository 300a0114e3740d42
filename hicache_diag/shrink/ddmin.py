"""Delta debugging (Zeller's ddmin) over a list, and a halving search over a count: both ask a
`fails(candidate)` oracle and keep only what it needs to still fail."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def ddmin(items: Sequence[T], fails: Callable[[list[T]], bool]) -> list[T]:
    """A 1-minimal sublist of `items` that still fails (removing any one element passes),
    assuming `fails(list(items))`. Tries complements first, as ddmin does."""
    current, n = list(items), 2
    while len(current) >= 2:
        chunk = max(1, len(current) // n)
        parts = [current[i : i + chunk] for i in range(0, len(current), chunk)]
        for i in range(len(parts)):
            rest = [x for j, p in enumerate(parts) if j != i for x in p]
            if rest and fails(rest):
                current, n = rest, max(n - 1, 2)
                break
        else:
            if n >= len(current):
                break
            n = min(len(current), 2 * n)
    if len(current) == 1 and fails([]):
        return []
    return current


def smallest_count(high: int, fails: Callable[[int], bool], low: int = 1) -> int:
    """The smallest n in [low, high] that still fails, by bisection (assumes `fails(high)` and
    that failing is monotone in n, which a shrink only needs roughly: the result is checked)."""
    lo, hi = low, high  # invariant: fails(hi); everything below lo is unknown or passes
    while lo < hi:
        mid = (lo + hi) // 2
        if fails(mid):
            hi = mid
        else:
            lo = mid + 1
    return hi
