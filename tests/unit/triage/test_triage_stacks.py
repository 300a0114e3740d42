"""Rank-set labels and the merged stack tree."""

from __future__ import annotations

from hicache_diag.evidence.ranks import RankId
from hicache_diag.evidence.stacks import Frame, RankDump, ThreadStack
from hicache_diag.triage.stacks import format_rank_set, merge_stacks


def test_format_rank_set_compresses_ranges():
    ranks = [RankId(pp=0, tp=t) for t in (0, 1, 2, 5)] + [RankId(pp=1, tp=0)]
    assert format_rank_set(ranks) == "PP0 TP0-2,5, PP1 TP0"


def _dump(pp, tp, *names):
    frames = tuple(Frame(n, "f.py", 1) for n in names)
    return RankDump(RankId(pp=pp, tp=tp), 1, None, [ThreadStack("MainThread", False, frames)])


def test_merge_splits_where_ranks_diverge():
    dumps = [
        _dump(0, 0, "recv", "recv_tensor_dict", "event_loop_pp"),
        _dump(0, 1, "recv", "recv_tensor_dict", "event_loop_pp"),
        _dump(1, 0, "recv", "_pp_sync", "event_loop_pp"),
    ]
    root = merge_stacks(dumps)
    main = root.children["MainThread"]
    loop = main.children["event_loop_pp (f.py)"]
    assert len(loop.ranks) == 3
    odd = loop.children["_pp_sync (f.py)"]
    assert format_rank_set(odd.ranks) == "PP1 TP0"
    assert root.to_json()["children"][0]["count"] == 3
