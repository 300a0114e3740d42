"""Statistics for bisect: Wilson score interval and median time to failure."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable

Z95 = 1.959963984540054  # two-sided 95% normal quantile


def wilson(failures: int, trials: int, z: float = Z95) -> tuple[float, float]:
    """95% Wilson score interval for a binomial rate; well-behaved at 0/n and n/n, unlike Wald."""
    if trials <= 0:
        return (0.0, 1.0)
    if not 0 <= failures <= trials:
        raise ValueError(f"failures {failures} outside 0..{trials}")
    p = failures / trials
    z2 = z * z
    denom = 1 + z2 / trials
    center = (p + z2 / (2 * trials)) / denom
    half = z * math.sqrt(p * (1 - p) / trials + z2 / (4 * trials * trials)) / denom
    # Exact bounds at 0/n and n/n; float rounding would otherwise leave 1e-17 off.
    lo = 0.0 if failures == 0 else max(0.0, center - half)
    hi = 1.0 if failures == trials else min(1.0, center + half)
    return (lo, hi)


def median_ttf(times: Iterable[float | None]) -> float | None:
    """Median time to failure over the failed trials; None when nothing failed."""
    values = [float(t) for t in times if t is not None]
    return statistics.median(values) if values else None
