"""Steps a rank ran with no batch and did not write: its folded idle slots.

The SGLang recorder folds a slot with no batch, no count, nothing queued and no decision acted
into its next line's `idle_polls` (docs/evidence.md): a line at step T with `idle_polls` k says
steps T-k .. T-1 ran on that rank, each an idle slot. Since every stage makes its slots in
lockstep (event_loop_pp: each slot receives the previous stage's request list), a rank that
folded step S while a peer wrote a batch at S ran a different batch there: nothing. What an
idle slot holds is known exactly, as the recorder would have written it: no batch, and zero of
every count whose non-zero value makes a line. Nothing else (the pools, the tree) is filled in.

A hung rank's last folded slots have no next line to declare them. Its stack can: a PP
follower waiting to receive a slot's request list (wait site `request-recv`) has received every
list its upstream stage sent, one per slot at the slot's start, before the upstream wrote that
slot's line; so it ran, unwritten and therefore idle, every slot up to the upstream's last line.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

import pandas as pd

from hicache_diag.diagnosis.divergence_values import plain, present
from hicache_diag.evidence.stacks import RankDump
from hicache_diag.rules.wait_sites import classify_thread

REQUEST_RECV = "request-recv"  # the wait-site rule book's name (rules/wait_sites.py)

# A folded slot's keys: the recorder's line for a None batch (`_batch_fields`) and the counts
# whose being non-zero would have made it write that slot.
IDLE_SLOT: dict[str, Any] = {
    "rids": [],
    "acks_consumed": {"write": 0, "load": 0},
    "evicted": 0,
    "load_backs": 0,
    "write_backs": 0,
}


class FoldedSlots:
    """Per rank, the steps its lines declared folded (only lines that carry `idle_polls`:
    a recorder that writes every step folds nothing)."""

    def __init__(self, frames: pd.DataFrame, ran_to: dict[int, int] | None = None) -> None:
        self._lines: dict[int, tuple[list[int], list[int]]] = {}
        self._last: dict[int, int] = {}
        self.ran_to = dict(ran_to or {})  # rank -> the last slot it ran, past its last line
        if frames.empty or "idle_polls" not in frames.columns:
            return
        self._last = {int(r): int(s) for r, s in frames.groupby("rank")["step"].max().items()}
        rows = frames[frames["idle_polls"].map(present)]
        for rank, own in rows.groupby("rank"):
            steps = [int(s) for s in own["step"]]
            folded = [int(plain(n)) for n in own["idle_polls"]]
            self._lines[int(rank)] = (steps, folded)

    def folded_at(self, rank: int, step: int) -> int | None:
        """The step of the line that folded `step` on `rank` (for a hung rank's last slots, the
        slot it is known to have run to), or None when nothing says it ran `step` idle."""
        steps, folded = self._lines.get(rank, ([], []))
        i = bisect_right(steps, step)  # the first line after `step`
        if i < len(steps) and steps[i] - folded[i] <= step:
            return steps[i]
        if rank in self._lines and self._last.get(rank, step) < step <= self.ran_to.get(rank, -1):
            return self.ran_to[rank]
        return None

    def idle_values(self, rows: pd.DataFrame, ranks: list[int], column: str) -> dict[int, Any]:
        """`column` of each of `ranks` that wrote no line at the step of `rows` but folded it."""
        if column not in IDLE_SLOT or rows.empty:
            return {}
        step = int(rows["step"].iloc[0])
        return {
            r: IDLE_SLOT[column]
            for r in ranks
            if r not in set(rows["rank"]) and self.folded_at(r, step) is not None
        }


def ran_past_last_line(frames: pd.DataFrame, stacks: dict[int, RankDump]) -> dict[int, int]:
    """rank -> the last slot it ran, for each PP follower whose saved stack waits for a request
    list: its upstream stage's last line (the lowest over that stage's TP ranks)."""
    if frames.empty or "pp" not in frames.columns or not stacks:
        return {}
    pp_of = {int(r): int(plain(p)) for r, p in frames.groupby("rank")["pp"].first().items()}
    last = frames.groupby("rank")["step"].max()
    out: dict[int, int] = {}
    for rank, dump in sorted(stacks.items()):
        pp = pp_of.get(rank)
        if not pp or classify_thread(dump.main_thread()).site != REQUEST_RECV:
            continue
        upstream = [int(last[r]) for r, p in pp_of.items() if p == pp - 1]
        if upstream and min(upstream) > int(last.get(rank, -1)):
            out[rank] = min(upstream)
    return out
