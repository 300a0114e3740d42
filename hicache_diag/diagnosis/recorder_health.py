"""Whether the per-step recorder saw what the server did: a recorder that failed is counted per
rank and shown, and one that missed every prefill of a rank while the server answered requests
cannot back an `ok` (its silence is not evidence of agreement)."""

from __future__ import annotations

from typing import Any

import pandas as pd


def recorder_errors(frames: pd.DataFrame) -> dict[str, int]:
    """Rank (str) -> steps whose line the recorder could not build."""
    if frames.empty or "recorder_error" not in frames.columns:
        return {}
    out: dict[str, int] = {}
    rows = frames[frames["recorder_error"].notna()]
    for rank, group in rows.groupby("rank"):
        counts = group["recorder_errors"] if "recorder_errors" in group.columns else None
        n = int(counts.fillna(1).sum()) if counts is not None else len(group)
        out[str(int(rank))] = n
    return out


def first_recorder_error(frames: pd.DataFrame) -> str | None:
    if frames.empty or "recorder_error" not in frames.columns:
        return None
    errors = frames["recorder_error"].dropna()
    return str(errors.iloc[0]) if len(errors) else None


def blind_ranks(frames: pd.DataFrame, ranks: list[int], answered: int) -> list[int]:
    """Ranks that recorded no prefill (no `extend_num_tokens`) although `answered` requests came
    back: every answered request was prefilled on every rank."""
    if answered <= 0:
        return []
    seen: set[int] = set()
    if not frames.empty and "extend_num_tokens" in frames.columns:
        rows = frames[frames["extend_num_tokens"].notna()]
        seen = {int(r) for r in rows["rank"].unique()}
    return [r for r in ranks if r not in seen]


def blind_recorder_reason(frames: pd.DataFrame, ranks: list[int], outputs: Any) -> str | None:
    """Why the run cannot be `ok` on this evidence, or None."""
    answered = len(outputs) if isinstance(outputs, dict) else 0
    blind = blind_ranks(frames, ranks, answered)
    if not blind:
        return None
    error = first_recorder_error(frames)
    why = f" (recorder error: {error})" if error else ""
    names = ", ".join(f"rank {r}" for r in blind)
    return (
        f"the recorder saw no prefill on {names} although the server answered {answered} "
        f"request(s){why}: the evidence is blind"
    )
