"""First divergence: the first step and must-agree field where ranks disagree, and its source.

The source is attributed from what each rank recorded as its own inputs (ready acks, failed host
allocs, eviction victims, local L3 hits, L3 progress), never from which fault was requested.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from hicache_diag.verdict import DivergenceSource, FirstDivergence

# How many steps before the divergence still count as "just before" for an input difference.
LOOKBACK_STEPS = 8
_L3_PROGRESS_KEYS = ("l3_progress", "l3_completed", "prefetch_completed", "completed_tokens")
# Within one step, report causes before effects: what a rank consumed or allocated decides the
# tree, and the tree decides the next batch (rids, extend tokens).
CAUSAL_ORDER = (
    "acks_consumed", "host_capacity", "host_free", "l3_hit_len", "write_backs", "load_backs",
    "evicted", "device_free", "tree_digest", "host_hit_len", "prefix_len", "rids",
    "extend_num_tokens",
)  # fmt: skip


@dataclass(slots=True)
class Divergence:
    first: FirstDivergence
    culprit_rank: int | None
    evidence: list[str] = field(default_factory=list)


def _canon(value: Any) -> str:
    """Comparable form of a recorded value (dicts compare regardless of key order)."""
    if isinstance(value, float) and value != value:  # NaN: a key this rank did not record
        return "null"
    return json.dumps(value, sort_keys=True, default=str)


def _present(value: Any) -> bool:
    return not (value is None or (isinstance(value, float) and value != value))


def _must_agree_fields(rows: pd.DataFrame) -> list[str]:
    fields: list[str] = []
    if "must_agree" not in rows.columns:
        return fields
    for keys in rows["must_agree"]:
        for key in keys if isinstance(keys, list) else []:
            if key not in fields and key in rows.columns:
                fields.append(key)
    rank = {name: i for i, name in enumerate(CAUSAL_ORDER)}
    return sorted(fields, key=lambda f: rank.get(f, -1))  # unknown keys first: recorded inputs


def _plain(value: Any) -> Any:
    """A count that pandas widened to float (a column with gaps, e.g. beside a crash record)
    is reported as the int it was recorded as."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value.item() if hasattr(value, "item") else value


def _values(rows: pd.DataFrame, column: str) -> dict[int, Any]:
    if column not in rows.columns:
        return {}
    pairs = zip(rows["rank"], rows[column], strict=True)
    return {int(r): _plain(v) for r, v in pairs if _present(v)}


def _disagree(values: dict[int, Any]) -> bool:
    return len({_canon(v) for v in values.values()}) > 1


def find_first(frames: pd.DataFrame) -> tuple[int, str, dict[int, Any]] | None:
    """(step, field, rank -> value) of the first disagreement, comparing the ranks present."""
    if frames.empty or "must_agree" not in frames.columns:
        return None
    for step, rows in frames.groupby("step", sort=True):
        if rows["rank"].nunique() < 2:
            continue
        for column in _must_agree_fields(rows):
            values = _values(rows, column)
            if len(values) >= 2 and _disagree(values):
                return int(step), column, values
    return None


def _odd_rank(values: dict[int, Any], prefer: str = "min") -> int | None:
    """The rank holding the minority value; on a tie the one with the smaller/larger number."""
    if not values:
        return None
    counts = Counter(_canon(v) for v in values.values())
    if len(counts) < 2:
        return None
    rare = min(counts.values())
    rare_ranks = [r for r, v in values.items() if counts[_canon(v)] == rare]
    if len(rare_ranks) == 1:
        return rare_ranks[0]

    def magnitude(r: int) -> float:
        v = values[r]
        if isinstance(v, dict):
            return float(sum(x for x in v.values() if isinstance(x, int | float)))
        return float(v) if isinstance(v, int | float) else 0.0

    pick = min if prefer == "min" else max
    return pick(rare_ranks, key=lambda r: (magnitude(r), -r if prefer == "min" else r))


def _window(frames: pd.DataFrame, step: int) -> pd.DataFrame:
    return frames[(frames["step"] <= step) & (frames["step"] > step - LOOKBACK_STEPS)]


def _sub(frames: pd.DataFrame, column: str, key: str) -> pd.Series:
    return frames[column].map(lambda d: d.get(key) if isinstance(d, dict) else None)


def _with_sub(frames: pd.DataFrame, column: str, key: str) -> pd.DataFrame | None:
    if column not in frames.columns:
        return None
    out = frames.assign(_v=_sub(frames, column, key))
    out = out[out["_v"].map(_present)]
    return None if out.empty else out


def _step_disagreement(frames: pd.DataFrame, column: str) -> tuple[int, dict[int, Any]] | None:
    """The first step at which `column` differs across the ranks that recorded it."""
    if column not in frames.columns:
        return None
    for step, rows in frames.groupby("step", sort=True):
        values = _values(rows, column)
        if len(values) >= 2 and _disagree(values):
            return int(step), values
    return None


Attribution = tuple[DivergenceSource, int | None, str]


def _fired_ranks(window: pd.DataFrame) -> set[int]:
    if "faults_fired" not in window.columns:
        return set()
    return {int(r) for r, f in zip(window["rank"], window["faults_fired"], strict=True) if f}


def _tie_break(values: dict[int, Any], window: pd.DataFrame, prefer: str = "min") -> int | None:
    """Minority rank; between two equal-sized camps, the rank whose own inputs were perturbed."""
    fired = _fired_ranks(window) & set(values)
    if len(values) == 2 and len(fired) == 1:
        return next(iter(fired))
    return _odd_rank(values, prefer)


def _ack_source(frames: pd.DataFrame, step: int, column: str, values: dict) -> Attribution | None:
    window = _window(frames, step)
    sync = _with_sub(window, "sync_received", "ack_count")
    if sync is not None:
        hit = _step_disagreement(sync.assign(ack_sync=sync["_v"]), "ack_sync")
        if hit:
            return (
                DivergenceSource.DMA_ACK_COUNT,
                _tie_break(hit[1], window),
                f"the relayed ack count differs at step {hit[0]}: {hit[1]}",
            )
    if column == "acks_consumed":
        ready = _values(frames[frames["step"] == step], "acks_ready")
        why = "each rank drained its own ready acks" if sync is None else "despite the ack sync"
        return (
            DivergenceSource.DMA_ACK_COUNT,
            _tie_break(ready or values, window),
            f"acks_consumed differ at step {step} ({why}; acks_ready {ready})",
        )
    if sync is None:
        hit = _step_disagreement(window, "acks_ready")
        if hit:
            return (
                DivergenceSource.DMA_ACK_COUNT,
                _tie_break(hit[1], window),
                f"ranks saw different ready DMA acks at step {hit[0]} with no ack sync: {hit[1]}",
            )
    return None


def _host_alloc_source(frames: pd.DataFrame, step: int) -> Attribution | None:
    window = _window(frames, step)
    if "host_alloc_failed" not in window.columns:
        return None
    failed = window.groupby("rank")["host_alloc_failed"].sum(min_count=1).fillna(0)
    bad = sorted(int(r) for r, n in failed.items() if n > 0)
    if not bad or len(bad) == len(failed):
        return None
    counts = {r: int(failed[r]) for r in bad}
    return (
        DivergenceSource.HOST_ALLOC,
        max(bad, key=lambda r: counts[r]),
        f"host alloc failed only on rank(s) {bad} just before step {step}: {counts}",
    )


def _l3_sources(frames: pd.DataFrame, step: int) -> Attribution | None:
    window = _window(frames, step)
    for key in _L3_PROGRESS_KEYS:
        sub = _with_sub(window, "sync_received", key)
        hit = _step_disagreement(sub.assign(p=sub["_v"]), "p") if sub is not None else None
        hit = hit or _step_disagreement(window, key)
        if hit:
            return (
                DivergenceSource.L3_PROGRESS,
                _tie_break(hit[1], window),
                f"L3 progress ({key}) differs at step {hit[0]}: {hit[1]}",
            )
    local = _step_disagreement(window, "l3_hit_len_local")
    if local and (_step_disagreement(window, "l3_hit_len") or "l3_hit_len" not in window):
        return (
            DivergenceSource.L3_HIT,
            _tie_break(local[1], window),
            f"local L3 hit lengths differ at step {local[0]}: {local[1]}",
        )
    return None


def _lru_source(frames: pd.DataFrame, step: int) -> Attribution | None:
    window = _window(frames, step)
    hit = _step_disagreement(window, "evict_victims")
    if not hit or "tree_digest" not in frames.columns:
        return None
    before = frames[frames["step"] == hit[0] - 1]
    if _disagree(_values(before, "tree_digest")):
        return None  # trees already differed: the victims follow from that, not from the clock
    clocks = _values(frames[frames["step"] == hit[0]], "clock")
    return (
        DivergenceSource.LRU_CLOCK,
        _tie_break(clocks, window, prefer="max") if clocks else _tie_break(hit[1], window),
        f"identical trees chose different eviction victims at step {hit[0]} (clocks {clocks})",
    )


def attribute(frames: pd.DataFrame, step: int, column: str, values: dict) -> Attribution:
    """Name the divergence source from the recorded per-rank inputs at and just before `step`."""
    for probe in (
        lambda: _host_alloc_source(frames, step),
        lambda: _ack_source(frames, step, column, values),
        lambda: _l3_sources(frames, step),
        lambda: _lru_source(frames, step),
    ):
        found = probe()
        if found:
            return found
    return DivergenceSource.UNKNOWN, _odd_rank(values), "no recorded per-rank input explains it"


def first_divergence(frames: pd.DataFrame) -> Divergence | None:
    found = find_first(frames)
    if found is None:
        return None
    step, column, values = found
    source, culprit, why = attribute(frames, step, column, values)
    first = FirstDivergence(
        step=step, field=column, values={str(r): v for r, v in values.items()}, source=source
    )
    lines = [
        f"first divergence at step {step} in {column}: {values}",
        f"source {source.value}: {why}",
    ]
    return Divergence(first=first, culprit_rank=culprit, evidence=lines)
