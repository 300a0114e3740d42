"""Mirrors sglang/srt/mem_cache/base_prefix_cache.py: the contract every prefix cache keeps.

The scheduler talks to `RadixCache` (L1 only) and `HiRadixCache` (L1 + L2 host tier) through
exactly this interface, so a run with `--enable-hierarchical-cache` off or on uses one code path.
Keys are token-id lists; every length handed in or out is a multiple of `page_size`. All methods
run on the scheduler thread unless a docstring says otherwise.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True, slots=True)
class MatchResult:
    """What `match_prefix` found.

    device_indices: device KV slots (int64) of the longest prefix resident on the device.
    last_device_node: deepest node whose value is on the device (lock it before use).
    last_host_node: deepest node of the match including host-only (evicted, backed-up) nodes;
        equals last_device_node when nothing is host-only.
    host_hit_length: tokens between last_device_node and last_host_node (host-only part).
    The nodes are the tree's own (`radix_cache.TreeNode`), typed Any as in SGLang's base: the
    contract sits below the trees that define them.
    """

    device_indices: torch.Tensor
    last_device_node: Any
    last_host_node: Any
    host_hit_length: int = 0


class BasePrefixCache(ABC):
    page_size: int

    @abstractmethod
    def match_prefix(self, key: list[int]) -> MatchResult:
        """Longest cached page-aligned prefix of `key`; stamps last_access_time on the path."""

    @abstractmethod
    def insert(self, key: list[int], value: torch.Tensor) -> int:
        """Insert `key` (page aligned) with device slots `value`; returns how many leading tokens
        were already cached. The caller frees its own duplicate slots `value[:returned]`."""

    @abstractmethod
    def evict(self, num_tokens: int) -> int:
        """Free at least `num_tokens` device tokens from unlocked leaves (LRU over
        last_access_time); returns the number freed. HiRadixCache demotes backed-up nodes to
        host instead of deleting them."""

    @abstractmethod
    def inc_lock_ref(self, node: Any) -> None:
        """Protect `node` and its ancestors from eviction."""

    @abstractmethod
    def dec_lock_ref(self, node: Any) -> None:
        """Undo one `inc_lock_ref`."""

    @abstractmethod
    def evictable_size(self) -> int: ...

    @abstractmethod
    def protected_size(self) -> int: ...

    @abstractmethod
    def total_size(self) -> int:
        """Tokens held on the device by the tree."""

    @abstractmethod
    def tree_digest(self) -> str:
        """Hash of the tree's structure and per-node tier state (device/host/backuped, lock refs),
        independent of slot indices, so equal digests across ranks mean equal trees."""

    @abstractmethod
    def check_integrity(self) -> None:
        """Raise AssertionError with the numbers in the message when bookkeeping is off."""

    # ---- HiCache hooks: no-ops on an L1-only cache -------------------------------------------
    def check_hicache_events(self) -> None:
        """Step ① of every micro-batch slot: consume DMA acks per the protocol switches."""
        return None

    def init_load_back(self, match: MatchResult, mem_quota: int) -> tuple[torch.Tensor, Any]:
        """Bring the host-only part of `match` back to the device if it fits in `mem_quota`
        tokens. Returns (device_indices, last_device_node) after the load-back (unchanged when
        nothing is loaded)."""
        return match.device_indices, match.last_device_node

    def ready_to_load_host_cache(self) -> int:
        """Start the queued loads; returns the producer index the forward waits on (-1: none)."""
        return -1

    def probe_stats(self) -> dict[str, Any]:
        """Evidence for rank{r}.jsonl (queue depths, ready/consumed acks, sync values, host
        free, write-backs, load-backs). Counters are reset by the call."""
        return {}
