"""Which scheduling decision a use belongs to: the DECISIONS table, then the nearest caller."""

from __future__ import annotations

from collections import deque

from hicache_diag.sources.index import Function, SourceIndex
from hicache_diag.sources.rules import CALLER_DEPTH, DECISIONS

UNKNOWN = ("unknown", None)


class Decisions:
    def __init__(self, index: SourceIndex, table: dict[str, str] = DECISIONS) -> None:
        self._index = index
        self._table = table
        self._memo: dict[int, tuple[str, str | None]] = {}

    def _own(self, fn: Function) -> str | None:
        for key in (fn.qualname, f"{fn.cls}.*" if fn.cls else None, fn.name):
            if key and key in self._table:
                return self._table[key]
        return None

    def of_name(self, name: str) -> str | None:
        """The category of a call by its callee name (the callee may be out of scope)."""
        return self._table.get(name)

    def of_function(self, fn: Function, callers: bool = True) -> tuple[str, str | None]:
        """(category, qualname it came from): fn's own entry, else the nearest caller's."""
        own = self._own(fn)
        if own:
            return own, fn.qualname
        if not callers:
            return UNKNOWN
        key = id(fn.node)
        if key not in self._memo:
            self._memo[key] = self._nearest_caller(fn)
        return self._memo[key]

    def _nearest_caller(self, fn: Function) -> tuple[str, str | None]:
        queue = deque([(fn, 0)])
        seen = {id(fn.node)}
        while queue:
            cur, depth = queue.popleft()
            if depth >= CALLER_DEPTH:
                continue
            for caller, _ in self._index.callers(cur):
                if id(caller.node) in seen:
                    continue
                seen.add(id(caller.node))
                if own := self._own(caller):
                    return own, caller.qualname
                queue.append((caller, depth + 1))
        return UNKNOWN
