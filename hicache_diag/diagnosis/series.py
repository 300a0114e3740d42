"""Per-rank timelines flattened from the jsonl: one row per (rank, step), numeric columns only."""

from __future__ import annotations

import pandas as pd

QUEUES = ("write_queue", "load_queue", "ack_write_queue", "ack_load_queue")
TIMELINE_COLUMNS = (
    "rank",
    "step",
    "extend_num_tokens",
    *QUEUES,
    "host_free",
    "acks_consumed_write",
    "acks_consumed_load",
    "inflight_sends",
)


def _sub(frames: pd.DataFrame, column: str, key: str) -> pd.Series:
    if column not in frames.columns:
        return pd.Series([None] * len(frames), index=frames.index, dtype="object")
    return frames[column].map(lambda d: d.get(key) if isinstance(d, dict) else None)


def timelines(frames: pd.DataFrame) -> pd.DataFrame:
    """queue depths, extend tokens, host pool free and consumed acks per rank and step."""
    if frames.empty:
        return pd.DataFrame(columns=list(TIMELINE_COLUMNS))
    out = pd.DataFrame({"rank": frames["rank"].astype(int), "step": frames["step"].astype(int)})
    for col in ("extend_num_tokens", "host_free", "inflight_sends"):
        out[col] = frames[col] if col in frames.columns else None
    for q in QUEUES:
        out[q] = _sub(frames, "queues", q)
    out["acks_consumed_write"] = _sub(frames, "acks_consumed", "write")
    out["acks_consumed_load"] = _sub(frames, "acks_consumed", "load")
    out = out[list(TIMELINE_COLUMNS)]
    return out.apply(pd.to_numeric, errors="coerce").sort_values(["step", "rank"])


def around(
    frames: pd.DataFrame,
    step: int,
    field: str,
    before: int = 3,
    after: int = 2,
    at_step: dict[str, object] | None = None,
):
    """The diverging field per rank for the steps around the first divergence (step x rank).
    `at_step`: the values the verdict compared at `step` (rank -> value), which include a
    rank's folded idle slot that wrote no line (idle_slots.py)."""
    if frames.empty or field not in frames.columns:
        return pd.DataFrame()
    rows = frames[(frames["step"] >= step - before) & (frames["step"] <= step + after)]
    # pivot_table cannot hold dict values, so build the step x rank table by hand.
    data: dict[int, dict[int, object]] = {}
    for s, r, v in zip(rows["step"], rows["rank"], rows[field], strict=True):
        data.setdefault(int(s), {})[int(r)] = v
    for r, v in (at_step or {}).items():
        data.setdefault(int(step), {}).setdefault(int(r), v)
    return pd.DataFrame.from_dict(data, orient="index").sort_index()
