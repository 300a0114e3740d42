"""First divergence: the first step and must-agree field where ranks disagree, and its source.

The source and the culprit rank are attributed from what each rank recorded as its own inputs
(ready acks, failed host allocs, eviction victims, local L3 hits, L3 progress), never from which
fault was requested or fired (`faults_fired` is the injection, not evidence).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from hicache_diag.diagnosis.attribution import attribute
from hicache_diag.diagnosis.divergence_values import (
    LOOKBACK_STEPS,
    disagree,
    only_some,
    per_rank_sum,
    rank_values,
)
from hicache_diag.diagnosis.idle_slots import FoldedSlots
from hicache_diag.evidence.verdict import DivergenceSource, FirstDivergence

# Within one step, report causes before effects: what a rank consumed or allocated decides the
# tree, and the tree decides the next batch (rids, extend tokens).
CAUSAL_ORDER = (
    "acks_consumed",
    "host_capacity",
    "host_free",
    "l3_hit_len",
    "write_backs",
    "load_backs",
    "evicted",
    "device_free",
    "tree_digest",
    "host_hit_len",
    "prefix_len",
    "rids",
    "extend_num_tokens",
)


@dataclass(slots=True)
class Divergence:
    first: FirstDivergence
    culprit_rank: int | None
    evidence: list[str] = field(default_factory=list)


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


def _agreeable(rows: pd.DataFrame, column: str) -> dict[int, Any]:
    """The values of `column` that must agree. A host-shortage side pool (`host_held`) shrinks
    one rank's pool on purpose: free slots plus held ones is what the trees must agree on."""
    values = rank_values(rows, column)
    if column == "host_free" and "host_held" in rows.columns:
        held = rank_values(rows, "host_held")
        values = {
            r: v + int(held.get(r) or 0) if isinstance(v, int | float) else v
            for r, v in values.items()
        }
    return values


def _first(
    frames: pd.DataFrame, folded: FoldedSlots, steps: set[int] | None = None
) -> tuple[int, str, dict[int, Any], list[int]] | None:
    """The first disagreement and the ranks whose value there is a folded idle slot's; only at
    `steps` when given (a caller that knows the others agree)."""
    if frames.empty or "must_agree" not in frames.columns:
        return None
    ranks = sorted(int(r) for r in frames["rank"].unique())
    search = frames if steps is None else frames[frames["step"].isin(steps)]
    for step, rows in search.groupby("step", sort=True):
        if rows["rank"].nunique() == len(ranks) == 1:
            continue
        for column in _must_agree_fields(rows):
            values = _agreeable(rows, column)
            idle = folded.idle_values(rows, ranks, column) if values else {}
            values = dict(sorted({**values, **idle}.items()))
            if len(values) >= 2 and disagree(values):
                return int(step), column, values, sorted(idle)
    return None


def find_first(frames: pd.DataFrame) -> tuple[int, str, dict[int, Any]] | None:
    """(step, field, rank -> value) of the first disagreement, comparing the ranks present at
    a step and those that ran it as a folded idle slot (idle_slots.py)."""
    found = _first(frames, FoldedSlots(frames))
    return found[:3] if found else None


def first_divergence(
    frames: pd.DataFrame, ran_to: dict[int, int] | None = None, steps: set[int] | None = None
) -> Divergence | None:
    """`ran_to`: rank -> the last slot a hung rank is known to have run past its last line
    (idle_slots.ran_past_last_line); `steps`: search only these (every other step is known to
    agree: a production recording's hours of lines), the rest kept for the attribution."""
    folded = FoldedSlots(frames, ran_to)
    found = _first(frames, folded, steps)
    if found is None:
        return None
    step, column, values, idle = found
    source, culprit, why = attribute(frames, step, column, values)
    first = FirstDivergence(
        step=step, field=column, values={str(r): v for r, v in values.items()}, source=source
    )
    lines = [f"first divergence at step {step} in {column}: {values}"]
    if idle:
        ran = rank_values(frames[frames["step"] == step], "rids")
        lines.append(
            f"at step {step} rank(s) {idle} ran no batch (an idle slot the recorder folded) "
            f"while {ran} ran"
        )
        last = frames.groupby("rank")["step"].max()
        for rank in (r for r in idle if folded.folded_at(r, step) == folded.ran_to.get(r)):
            lines.append(
                f"rank {rank}'s last line is at step {int(last[rank])}: at the hang it waited "
                f"for a request list, so it had run every slot up to step {folded.ran_to[rank]} "
                "(its upstream stage's last line), those it did not write idle"
            )
    lines.append(f"source {source.value}: {why}")
    return Divergence(first=first, culprit_rank=culprit, evidence=lines)


# Per-rank inputs that a rank alone can see, each counted per step in rank{r}.jsonl.
_LOCAL_INPUTS = (
    (
        "host_shortage",
        "write-through backups skipped for a short host pool",
        DivergenceSource.HOST_ALLOC,
    ),
    ("host_alloc_failed", "host allocs failed", DivergenceSource.HOST_ALLOC),
    ("host_evicted", "host evictions (evict_host)", DivergenceSource.HOST_ALLOC),
    ("host_pool_refused", "the host pool refused allocs", DivergenceSource.HOST_ALLOC),
    ("clock_regressions", "clock stamps went back", DivergenceSource.LRU_CLOCK),
)


def lone_local_input(frames: pd.DataFrame) -> tuple[int, DivergenceSource, str] | None:
    """With no recorded step differing (the failure came inside the step the ranks parted in,
    e.g. a TP rank skipping a collective its peer entered), the one rank whose own inputs went
    wrong in its last LOOKBACK_STEPS recorded steps, when exactly one did."""
    if frames.empty:
        return None
    last = frames.groupby("rank", group_keys=False).tail(LOOKBACK_STEPS)
    for column, what, source in _LOCAL_INPUTS:
        counts = only_some(per_rank_sum(last, column))
        if len(counts) != 1:
            continue
        rank, n = next(iter(counts.items()))
        hit = last[(last["rank"] == rank) & (last[column].fillna(0) > 0)]
        why = (
            f"no recorded step differs before the failure, but only rank {rank}'s {what} in its "
            f"last {LOOKBACK_STEPS} recorded steps ({n}, the last at step {int(hit['step'].max())})"
            f"; source {source.value}"
        )
        return rank, source, why
    return None
