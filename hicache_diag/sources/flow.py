"""Follows one per-rank value from its read to the decisions it feeds, across functions.

Taint is by name: a local, a `self.` attribute, a tuple element (walk.py walks one function).
A value is "aligned" by the sync steps it went through: an argument passed to an all_reduce or
a PP relay is aligned after the call. The walk goes down into callees that receive the value,
up to callers when a function returns it, across attributes (a stored value is followed to the
functions that read that attribute), and across queues (an item `put` on `x.some_queue` is
followed to `some_queue.get`).
"""

from __future__ import annotations

import ast
from collections.abc import Callable

from hicache_diag.sources.decisions import Decisions
from hicache_diag.sources.guards import LeaderGuards
from hicache_diag.sources.index import Function, SourceIndex, callee_name, same_object
from hicache_diag.sources.model import State
from hicache_diag.sources.rules import MAX_HOPS, MAX_READERS
from hicache_diag.sources.sync import SyncSummaries
from hicache_diag.sources.walk import FunctionWalk, Trace


class Tracer:
    def __init__(self, index: SourceIndex, sync: SyncSummaries, decisions: Decisions) -> None:
        self.index = index
        self.sync = sync
        self.decisions = decisions
        self.leaders = LeaderGuards(index)

    def follow(self, fn: Function, node: ast.AST) -> Trace:
        """Every use of the value of `node` (an expression in `fn`)."""
        out = Trace()
        FunctionWalk(self, fn, lambda n: n is node, {}, (), 0, out, set(), up=True).run()
        return out

    def follow_stored(
        self,
        attr: str,
        state: State,
        depth: int,
        out: Trace,
        seen: set,
        on_self: str | None = None,
        hops: int = 0,
        positions: frozenset[int] | None = None,
    ) -> None:
        """A value stored in `x.attr` reaches the functions that read `.attr`; stored on self
        (`on_self` = the class), only that class's own `self.attr` reads, so that common names
        do not join unrelated classes. `positions`: a tuple was stored and only these of its
        elements carry the value (`self._pending = (req, deadline)`)."""
        out.attrs.add(attr)
        if on_self is not None:
            pool = [
                fn
                for fn in self.index.self_attr_readers.get(attr, [])
                if same_object(fn.cls, on_self)
            ]
        else:
            pool = self.index.attr_readers.get(attr, [])
        if len(pool) > MAX_READERS:  # a common name: follow only into decision functions
            pool = [fn for fn in pool if self.decisions.of_function(fn, callers=False)[1]]
        if len(pool) > MAX_READERS or hops >= MAX_HOPS:
            return
        for fn in [fn for fn in pool if id(fn.node) not in seen]:
            match = _attr_load_matcher(attr)
            walk = FunctionWalk(self, fn, match, {}, state, depth + 1, out, seen, up=True)
            walk.hops = hops + 1
            walk.seed_positions = positions
            walk.run()

    def follow_queue(
        self, queue: str, state: State, depth: int, out: Trace, seen: set, hops: int = 0
    ) -> None:
        def match(n: ast.AST) -> bool:
            return (
                isinstance(n, ast.Call)
                and callee_name(n) in ("get", "get_nowait")
                and isinstance(n.func, ast.Attribute)
                and ast.unparse(n.func.value).rsplit(".", 1)[-1] == queue
            )

        pool = self.index.queue_readers.get(queue, [])
        if len(pool) > MAX_READERS or hops >= MAX_HOPS:
            return
        for fn in [fn for fn in pool if id(fn.node) not in seen]:
            walk = FunctionWalk(self, fn, match, {}, state, depth + 1, out, seen, up=True)
            walk.hops = hops + 1
            walk.run()


def _attr_load_matcher(attr: str) -> Callable[[ast.AST], bool]:
    def match(n: ast.AST) -> bool:
        return isinstance(n, ast.Attribute) and n.attr == attr and isinstance(n.ctx, ast.Load)

    return match
