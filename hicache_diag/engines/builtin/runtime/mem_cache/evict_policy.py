"""Mirrors sglang/srt/mem_cache/evict_policy.py: eviction priorities, plus the tree's clock.

The clock is ours (the `lru-clock` switch, #22759): `monotonic` stamps `last_access_time` with the
rank's wall clock through the `now` hook (the clock-skew fault point); `logical` advances a
counter on every stamp, so ranks that apply the same operations stamp the same values.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from hicache_diag.faults.hooks import Hooks


class Evictable(Protocol):
    """What a strategy reads of a node (`radix_cache.TreeNode` has it): the policy stays below
    the tree that uses it."""

    hit_count: int
    last_access_time: float


class EvictionStrategy(ABC):
    @abstractmethod
    def get_priority(self, node: Evictable) -> Any:
        """Lower evicts first."""


class LRUStrategy(EvictionStrategy):
    def get_priority(self, node: Evictable) -> Any:
        return node.last_access_time


class LFUStrategy(EvictionStrategy):
    def get_priority(self, node: Evictable) -> Any:
        return (node.hit_count, node.last_access_time)


class TreeClock:
    """The value a tree stamps `last_access_time` with; `mode` is the lru-clock switch."""

    def __init__(self, mode: str = "logical", hooks: Hooks | None = None) -> None:
        if mode not in ("monotonic", "logical"):
            raise ValueError(f"unknown lru-clock mode {mode!r}; valid: monotonic, logical")
        self.mode, self.hooks = mode, hooks
        self.counter = 0
        self.last = 0.0
        # Stamps lower than the one before: a real monotonic clock never goes back, so a count
        # on one rank only is that rank's clock at fault (probe evidence, drained per step).
        self.regressions = 0

    def now(self) -> float:
        if self.mode == "logical":
            self.counter += 1  # advance on every stamp, not once per batch (#22759 review)
            self.last = float(self.counter)
        else:
            value = time.monotonic()
            stamp = self.hooks.apply("now", value) if self.hooks is not None else value
            self.regressions += stamp < self.last
            self.last = stamp
        return self.last

    def take_regressions(self) -> int:
        """Regressions since the last call (the recorder's per-step count)."""
        n, self.regressions = self.regressions, 0
        return n
