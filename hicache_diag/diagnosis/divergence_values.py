"""The ranks' recorded values, compared: which differ, which rank is odd, per-rank sums.

Shared by the first-divergence search (divergence.py) and the source attribution
(attribution.py, host_attribution.py).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pandas as pd

# How many steps before the divergence still count as "just before" for an input difference.
LOOKBACK_STEPS = 8


def canon(value: Any) -> str:
    """Comparable form of a recorded value (dicts compare regardless of key order)."""
    if isinstance(value, float) and value != value:  # NaN: a key this rank did not record
        return "null"
    return json.dumps(value, sort_keys=True, default=str)


def present(value: Any) -> bool:
    return not (value is None or (isinstance(value, float) and value != value))


def plain(value: Any) -> Any:
    """A count that pandas widened to float (a column with gaps, e.g. beside a crash record)
    is reported as the int it was recorded as."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value.item() if hasattr(value, "item") else value


def rank_values(rows: pd.DataFrame, column: str) -> dict[int, Any]:
    if column not in rows.columns:
        return {}
    pairs = zip(rows["rank"], rows[column], strict=True)
    return {int(r): plain(v) for r, v in pairs if present(v)}


def disagree(values: dict[int, Any]) -> bool:
    return len({canon(v) for v in values.values()}) > 1


def odd_rank(values: dict[int, Any], prefer: str = "min") -> int | None:
    """The rank holding the minority value; on a tie the one with the smaller/larger number."""
    if not values:
        return None
    counts = Counter(canon(v) for v in values.values())
    if len(counts) < 2:
        return None
    rare = min(counts.values())
    rare_ranks = [r for r, v in values.items() if counts[canon(v)] == rare]
    if len(rare_ranks) == 1:
        return rare_ranks[0]

    def magnitude(r: int) -> float:
        v = values[r]
        if isinstance(v, dict):
            return float(sum(x for x in v.values() if isinstance(x, int | float)))
        return float(v) if isinstance(v, int | float) else 0.0

    pick = min if prefer == "min" else max
    return pick(rare_ranks, key=lambda r: (magnitude(r), -r if prefer == "min" else r))


def lookback(frames: pd.DataFrame, step: int) -> pd.DataFrame:
    return frames[(frames["step"] <= step) & (frames["step"] > step - LOOKBACK_STEPS)]


def _sub(frames: pd.DataFrame, column: str, key: str) -> pd.Series:
    return frames[column].map(lambda d: d.get(key) if isinstance(d, dict) else None)


def with_sub(frames: pd.DataFrame, column: str, key: str) -> pd.DataFrame | None:
    if column not in frames.columns:
        return None
    out = frames.assign(_v=_sub(frames, column, key))
    out = out[out["_v"].map(present)]
    return None if out.empty else out


def step_disagreement(frames: pd.DataFrame, column: str) -> tuple[int, dict[int, Any]] | None:
    """The first step at which `column` differs across the ranks that recorded it."""
    if column not in frames.columns:
        return None
    for step, rows in frames.groupby("step", sort=True):
        values = rank_values(rows, column)
        if len(values) >= 2 and disagree(values):
            return int(step), values
    return None


def per_rank_sum(window: pd.DataFrame, column: str) -> dict[int, int]:
    if column not in window.columns:
        return {}
    sums = window.groupby("rank")[column].sum(min_count=1).fillna(0)
    return {int(r): int(n) for r, n in sums.items()}


def only_some(counts: dict[int, int]) -> dict[int, int]:
    """The ranks with a non-zero count, when not every rank has one."""
    bad = {r: n for r, n in counts.items() if n > 0}
    return bad if bad and len(bad) < len(counts) else {}
