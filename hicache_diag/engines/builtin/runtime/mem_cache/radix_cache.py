"""Mirrors sglang/srt/mem_cache/radix_cache.py: the page-granular L1 radix tree."""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Iterator
from typing import Any

import torch

from hicache_diag.engines.builtin.runtime.mem_cache.allocator import TokenToKVPoolAllocator
from hicache_diag.engines.builtin.runtime.mem_cache.base_prefix_cache import (
    BasePrefixCache,
    MatchResult,
)
from hicache_diag.engines.builtin.runtime.mem_cache.evict_policy import (
    LFUStrategy,
    LRUStrategy,
    TreeClock,
)

_EMPTY = torch.empty(0, dtype=torch.int64)


class TreeNode:
    """One edge of the tree: `key` tokens (whole pages), device slots `value` (None once evicted
    from the device), host slots `host_value` (None unless backed up). Ids come from the owning
    tree's counter, so ranks that apply the same operations give nodes the same ids."""

    __slots__ = (
        "id",
        "children",
        "parent",
        "key",
        "value",
        "host_value",
        "lock_ref",
        "hit_count",
        "host_ref_counter",
        "last_access_time",
    )

    def __init__(self, node_id: int, parent: TreeNode | None = None, key: list[int] | None = None):
        self.id = node_id
        self.children: dict[tuple[int, ...], TreeNode] = {}
        self.parent = parent
        self.key: list[int] = key or []
        self.value: torch.Tensor | None = None
        self.host_value: torch.Tensor | None = None
        self.lock_ref = 0
        self.hit_count = 0
        self.host_ref_counter = 0
        self.last_access_time = 0.0

    @property
    def evicted(self) -> bool:
        return self.value is None

    @property
    def backuped(self) -> bool:
        return self.host_value is not None


class RadixCache(BasePrefixCache):
    """L1-only prefix cache. Scheduler thread only. `evictable_size_` counts device tokens of
    unlocked nodes, `protected_size_` those of locked nodes; the root is never counted."""

    def __init__(
        self,
        allocator: TokenToKVPoolAllocator,
        page_size: int,
        clock: TreeClock | None = None,
        eviction_policy: str = "lru",
    ) -> None:
        self.allocator, self.page_size = allocator, page_size
        self.clock = clock or TreeClock("logical")
        self.eviction_strategy = LFUStrategy() if eviction_policy == "lfu" else LRUStrategy()
        self.reset()

    def reset(self) -> None:
        self._next_id = 0
        self.root_node = TreeNode(self._new_id())
        self.root_node.value = _EMPTY
        self.root_node.lock_ref = 1
        self.evictable_size_ = 0
        self.protected_size_ = 0
        self.evicted_tokens = 0
        self.evict_victims: list[str] = []

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    # ---- keys -------------------------------------------------------------------------------
    def _page_key(self, key: list[int]) -> tuple[int, ...]:
        return tuple(key[: self.page_size])

    def _match_len(self, a: list[int], b: list[int]) -> int:
        """Common prefix length, rounded down to whole pages."""
        n = 0
        limit = min(len(a), len(b))
        while n < limit and a[n] == b[n]:
            n += 1
        return n // self.page_size * self.page_size

    def _stamp(self, node: TreeNode) -> None:
        node.last_access_time = self.clock.now()

    # ---- match ------------------------------------------------------------------------------
    def _match_nodes(self, key: list[int]) -> list[TreeNode]:
        """Nodes on the longest matched path (root excluded), splitting the last one if the match
        ends inside it; stamps every node visited."""
        key = key[: len(key) // self.page_size * self.page_size]
        node, path = self.root_node, []
        self._stamp(node)
        while key and self._page_key(key) in node.children:
            child = node.children[self._page_key(key)]
            self._stamp(child)
            plen = self._match_len(child.key, key)
            if plen < len(child.key):
                path.append(self._split_node(child, plen))
                break
            path.append(child)
            node, key = child, key[plen:]
        return path

    def match_prefix(self, key: list[int]) -> MatchResult:
        path = self._match_nodes(key)
        last = path[-1] if path else self.root_node
        return MatchResult(_cat([n.value for n in path]), last, last, 0)

    def _split_node(self, child: TreeNode, split_len: int) -> TreeNode:
        """Cut `child` after `split_len` tokens; the new upper node inherits its state."""
        new = TreeNode(self._new_id(), child.parent, child.key[:split_len])
        for attr in ("lock_ref", "hit_count", "host_ref_counter", "last_access_time"):
            setattr(new, attr, getattr(child, attr))
        if child.value is not None:
            new.value, child.value = child.value[:split_len], child.value[split_len:]
        if child.host_value is not None:
            new.host_value = child.host_value[:split_len]
            child.host_value = child.host_value[split_len:]
        child.parent.children[self._page_key(new.key)] = new
        child.key = child.key[split_len:]
        child.parent = new
        new.children[self._page_key(child.key)] = child
        return new

    # ---- insert -----------------------------------------------------------------------------
    def insert(self, key: list[int], value: torch.Tensor) -> int:
        if len(key) % self.page_size or len(key) != len(value):
            raise ValueError(
                f"insert of {len(key)} tokens / {len(value)} slots is not page aligned "
                f"(page_size {self.page_size})"
            )
        node, prefix = self.root_node, 0
        self._stamp(node)
        while key:
            child = node.children.get(self._page_key(key))
            if child is None:
                self._add_leaf(node, key, value)
                break
            self._stamp(child)
            plen = self._match_len(child.key, key)
            if plen < len(child.key):
                child = self._split_node(child, plen)
            prefix += self._on_matched(child, value[:plen])
            node, key, value = child, key[plen:], value[plen:]
        return prefix

    def _on_matched(self, node: TreeNode, value: torch.Tensor) -> int:
        """A node fully covered by an insert; returns how many of its tokens were cached."""
        return len(node.key)

    def _add_leaf(self, parent: TreeNode, key: list[int], value: torch.Tensor) -> TreeNode:
        node = TreeNode(self._new_id(), parent, list(key))
        node.value = value.clone()
        parent.children[self._page_key(key)] = node
        self.evictable_size_ += len(key)
        self._stamp(node)
        return node

    # ---- evict ------------------------------------------------------------------------------
    def _iter_nodes(self) -> Iterator[TreeNode]:
        stack = [self.root_node]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def _is_device_leaf(self, node: TreeNode) -> bool:
        return (
            node is not self.root_node
            and node.value is not None
            and all(c.value is None for c in node.children.values())
        )

    def _evictable_leaves(self) -> list[TreeNode]:
        return [n for n in self._iter_nodes() if self._is_device_leaf(n) and n.lock_ref == 0]

    def _heap_entry(self, node: TreeNode) -> tuple[Any, int, TreeNode]:
        return (self.eviction_strategy.get_priority(node), node.id, node)

    def evict(self, num_tokens: int) -> int:
        heap = [self._heap_entry(n) for n in self._evictable_leaves()]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            node = heapq.heappop(heap)[2]
            self.evict_victims.append(self.node_digest(node))
            freed += self._evict_node(node)
            parent = node.parent
            if self._is_device_leaf(parent) and parent.lock_ref == 0:
                heapq.heappush(heap, self._heap_entry(parent))
        self.evicted_tokens += freed
        return freed

    def _evict_node(self, node: TreeNode) -> int:
        """Free a device leaf's slots and drop it from the tree."""
        self.allocator.free(node.value)
        self.evictable_size_ -= len(node.key)
        node.value = None
        self._delete_leaf(node)
        return len(node.key)

    def _delete_leaf(self, node: TreeNode) -> None:
        del node.parent.children[self._page_key(node.key)]

    # ---- locks and sizes --------------------------------------------------------------------
    def _device_len(self, node: TreeNode) -> int:
        return len(node.key) if node.value is not None else 0

    def inc_lock_ref(self, node: TreeNode) -> None:
        while node is not self.root_node:
            if node.lock_ref == 0:
                self.evictable_size_ -= self._device_len(node)
                self.protected_size_ += self._device_len(node)
            node.lock_ref += 1
            node = node.parent

    def dec_lock_ref(self, node: TreeNode) -> None:
        while node is not self.root_node:
            if node.lock_ref <= 0:
                raise AssertionError(f"dec_lock_ref on node {node.id} with lock_ref 0")
            if node.lock_ref == 1:
                self.evictable_size_ += self._device_len(node)
                self.protected_size_ -= self._device_len(node)
            node.lock_ref -= 1
            node = node.parent

    def evictable_size(self) -> int:
        return self.evictable_size_

    def protected_size(self) -> int:
        return self.protected_size_

    def total_size(self) -> int:
        return self.evictable_size_ + self.protected_size_

    # ---- evidence and invariants ------------------------------------------------------------
    def node_digest(self, node: TreeNode) -> str:
        """Hash of the node's full token path: the same node on every rank, whatever its slots."""
        keys = []
        while node is not None and node is not self.root_node:
            keys.append(node.key)
            node = node.parent
        tokens = [t for k in reversed(keys) for t in k]
        return hashlib.sha1(str(tokens).encode()).hexdigest()[:12]

    def tree_digest(self) -> str:
        h = hashlib.sha1()
        stack = [self.root_node]
        while stack:
            node = stack.pop()
            h.update(f"{node.key}|{node.evicted}|{node.backuped}|{node.lock_ref};".encode())
            stack.extend(node.children[k] for k in sorted(node.children, reverse=True))
        return h.hexdigest()[:16]

    def check_integrity(self) -> None:
        evictable = protected = 0
        for node in self._iter_nodes():
            if node is self.root_node:
                continue
            self._check_node(node)
            if node.value is not None:
                if node.lock_ref > 0:
                    protected += len(node.key)
                else:
                    evictable += len(node.key)
        assert (evictable, protected) == (self.evictable_size_, self.protected_size_), (
            f"sizes off: tree has evictable {evictable} protected {protected}, counters say "
            f"{self.evictable_size_} / {self.protected_size_}"
        )
        used = self.allocator.size - self.allocator.available_size()
        assert used >= evictable + protected, (
            f"tree holds {evictable + protected} device tokens but only {used} are allocated"
        )

    def _check_node(self, node: TreeNode) -> None:
        n = len(node.key)
        assert n and n % self.page_size == 0, f"node {node.id} key length {n} not page aligned"
        assert node.parent.children.get(self._page_key(node.key)) is node, (
            f"node {node.id} not reachable from its parent under its first page"
        )
        assert node.lock_ref >= 0, f"node {node.id} lock_ref {node.lock_ref}"
        for tier, v in (("value", node.value), ("host_value", node.host_value)):
            assert v is None or len(v) == n, f"node {node.id} {tier} {len(v)} != key {n}"
        if node.value is not None and node.parent is not self.root_node:
            assert node.parent.value is not None, (
                f"node {node.id} on device under evicted parent {node.parent.id}"
            )

    def probe_stats(self) -> dict[str, Any]:
        stats = {
            "device_free": self.allocator.available_size(),
            "evicted": self.evicted_tokens,
            "evict_victims": self.evict_victims,
            "clock": self.clock.last,
            "clock_regressions": self.clock.take_regressions(),
        }
        self.evicted_tokens, self.evict_victims = 0, []
        return stats


def _cat(values: list[torch.Tensor | None]) -> torch.Tensor:
    parts = [v for v in values if v is not None]
    return torch.cat(parts) if parts else _EMPTY.clone()
