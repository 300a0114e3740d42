"""Merge many ranks' stacks into one prefix tree whose nodes carry the set of ranks in them.

After LLNL STAT and Baidu AIHC: the rank that waits somewhere else stands out as a branch with a
small rank set. Roots are thread names, then frames from the outermost call inwards.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from hicache_diag.evidence.ranks import RankId
from hicache_diag.evidence.stacks import RankDump


def _ranges(values: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    out: list[str] = []
    start = prev = values[0]
    for value in values[1:] + [None]:  # type: ignore[list-item]
        if value is not None and value == prev + 1:
            prev = value
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if value is not None:
            start = prev = value
    return ",".join(out)


def format_rank_set(ranks: Iterable[RankId]) -> str:
    """Compressed label: `PP0 TP0-3, PP1 TP0,2`, grouped by pipeline stage (and DP when set)."""
    by_stage: dict[tuple[int | None, int], list[int]] = defaultdict(list)
    for rank in set(ranks):
        by_stage[(rank.dp, rank.pp)].append(rank.tp)
    parts = []
    for (dp, pp), tps in sorted(by_stage.items(), key=lambda kv: (kv[0][0] or 0, kv[0][1])):
        prefix = f"DP{dp} " if dp is not None else ""
        parts.append(f"{prefix}PP{pp} TP{_ranges(sorted(tps))}")
    return ", ".join(parts)


@dataclass(slots=True)
class StackNode:
    label: str
    ranks: set[RankId] = field(default_factory=set)
    children: dict[str, StackNode] = field(default_factory=dict)

    def child(self, label: str) -> StackNode:
        if label not in self.children:
            self.children[label] = StackNode(label)
        return self.children[label]

    def to_json(self) -> dict[str, Any]:
        return {
            "frame": self.label,
            "ranks": format_rank_set(self.ranks),
            "count": len(self.ranks),
            "children": [c.to_json() for c in self.children.values()],
        }


def merge_stacks(dumps: Iterable[RankDump], main_only: bool = False) -> StackNode:
    """One tree over every (rank, thread); frames are named `func (file)` without line numbers,
    so ranks at the same call site merge even when their versions differ by a few lines."""
    root = StackNode("all ranks")
    for dump in dumps:
        if dump.rank is None:
            continue
        threads = [dump.main_thread()] if main_only else dump.threads
        for thread in threads:
            if thread is None:
                continue
            root.ranks.add(dump.rank)
            # `Thread-7 (prefetch_thread_func)`: the counter differs per process, the target not.
            node = root.child(re.sub(r"Thread-\d+", "Thread-N", thread.name or "thread"))
            node.ranks.add(dump.rank)
            for frame in reversed(thread.frames):
                if frame.name.startswith("0x"):
                    continue  # unresolved native address: differs per process, merges nothing
                node = node.child(frame.short)
                node.ranks.add(dump.rank)
    return root
