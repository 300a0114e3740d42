"""The silent ledger shift: ranks that drained the same relayed ack count but finished (and
unlocked) the write-through of different nodes.

In 0.5.2x PP0 counts its ready write acks and `_pp_sync` relays the count; a follower pops that
many acks off its own `ack_write_queue` (`writing_check(finish_count=...)`). When the stages'
queues hold different nodes (one stage skipped a backup the other made), the counts still
agree, so nothing crashes, but the follower unlocks nodes other than the ones the leader
unlocked: its lock ledger has shifted. The recorder writes the node ids each rank finished in
`write_acked_nodes` (`_finish_write_through_ack`); node ids follow the tree's insertion order,
equal on every rank while the trees are.
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd


def first_ledger_shift(frames: pd.DataFrame) -> tuple[int, dict[int, Any]] | None:
    """(step, rank -> node ids) of the first step whose ranks finished different nodes with
    the same count."""
    if frames.empty or "write_acked_nodes" not in frames.columns:
        return None
    for step, rows in frames.groupby("step", sort=True):
        acked = {
            int(r): v
            for r, v in zip(rows["rank"], rows["write_acked_nodes"], strict=True)
            if isinstance(v, list) and v
        }
        if len(acked) < 2 or len({len(v) for v in acked.values()}) > 1:
            continue  # one rank drained nothing, or other counts: not a shift of the same count
        if len({json.dumps(sorted(map(str, v))) for v in acked.values()}) > 1:
            return int(step), acked
    return None


def ledger_lines(frames: pd.DataFrame) -> list[str]:
    found = first_ledger_shift(frames)
    if found is None:
        return []
    step, acked = found
    return [
        f"silent ledger shift at step {step}: with the same relayed ack count the ranks "
        f"finished the write-through of different nodes {acked}; each unlocked nodes the "
        "others did not (no crash: the lock ledgers no longer describe the same nodes)"
    ]
