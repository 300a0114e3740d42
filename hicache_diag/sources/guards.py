"""A single decision point: a function whose every call site sits under a test that only one
rank passes (`pp_rank == 0 and attn_tp_rank == 0 ...`) decides for all ranks, whatever
per-rank value it reads; the others learn the outcome with the requests (0.5.20's
`_poll_timeout_aborts`, called from `recv_requests` on the puller only, upstream #37143)."""

from __future__ import annotations

import ast

from hicache_diag.sources.index import Function, SourceIndex
from hicache_diag.sources.model import Alignment

# Rank attributes a leader test compares with 0, and the group each names.
_RANKS = {
    "pp_rank": "pp",
    "tp_rank": "tp",
    "attn_tp_rank": "attn_tp",
    "attn_cp_rank": "attn_cp",
    "attn_dp_rank": "attn_dp",
    "moe_ep_rank": "moe_ep",
}


def _zero_tests(test: ast.expr) -> set[str]:
    """The rank groups `test` requires to be rank 0 (`x.pp_rank == 0`, joined by `and`)."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return set().union(*(_zero_tests(v) for v in test.values))
    if (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], ast.Eq)
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value == 0
    ):
        name = ast.unparse(test.left).rsplit(".", 1)[-1]
        if name in _RANKS:
            return {_RANKS[name]}
    return set()


def _guard_of(caller: Function, call: ast.Call) -> set[str]:
    """Rank groups that must be 0 for `call` to run: the tests of the `if`s around it."""
    found: set[str] = set()
    for node in ast.walk(caller.node):
        if isinstance(node, ast.If) and any(
            sub is call for stmt in node.body for sub in ast.walk(stmt)
        ):
            found |= _zero_tests(node.test)
    return found


class LeaderGuards:
    def __init__(self, index: SourceIndex) -> None:
        self._index = index
        self._memo: dict[int, Alignment | None] = {}

    def alignment(self, fn: Function) -> Alignment | None:
        """A single-decision alignment when every call site of `fn` is a leader's only, else
        None (a function nobody in scope calls is not known to be one)."""
        key = id(fn.node)
        if key not in self._memo:
            sites = self._index.callers(fn)
            guards = [_guard_of(caller, call) for caller, call in sites]
            if sites and all("pp" in g for g in guards):
                common = set.intersection(*guards)
                tp = bool(common & {"tp", "attn_tp"})
                self._memo[key] = Alignment("leader-decision", (), True, tp)
            else:
                self._memo[key] = None
        return self._memo[key]


__all__ = ["LeaderGuards"]
