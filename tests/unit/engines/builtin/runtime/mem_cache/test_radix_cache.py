"""RadixCache against a plain model: page-granular match/insert/evict, locks, digests."""

from __future__ import annotations

import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from hicache_diag.engines.builtin.runtime.mem_cache.allocator import TokenToKVPoolAllocator
from hicache_diag.engines.builtin.runtime.mem_cache.radix_cache import RadixCache

PAGE = 2


def make(size: int = 64) -> tuple[TokenToKVPoolAllocator, RadixCache]:
    alloc = TokenToKVPoolAllocator(size, PAGE)
    return alloc, RadixCache(alloc, PAGE)


def put(alloc: TokenToKVPoolAllocator, tree: RadixCache, key: list[int]) -> int:
    value = alloc.alloc(len(key))
    assert value is not None, f"pool short for {len(key)} tokens"
    prefix = tree.insert(key, value)
    alloc.free(value[:prefix])  # the caller frees its duplicate slots
    return prefix


def test_match_is_page_granular_and_splits():
    alloc, tree = make()
    put(alloc, tree, [1, 2, 3, 4, 5, 6])
    m = tree.match_prefix([1, 2, 3, 9, 9])
    assert m.device_indices.tolist() == [0, 1], "a match ending inside a page rounds down"
    assert tree.match_prefix([1, 2, 3, 4, 7, 7]).device_indices.tolist() == [0, 1, 2, 3]
    tree.check_integrity()
    assert tree.total_size() == 6


def test_insert_returns_cached_prefix_and_evict_frees_lru_leaf():
    alloc, tree = make(16)
    put(alloc, tree, [1, 1, 2, 2])
    assert put(alloc, tree, [1, 1, 3, 3]) == 2
    tree.match_prefix([1, 1, 2, 2])  # touch: [3,3] leaf is now the LRU one
    assert tree.evict(2) == 2
    assert tree.match_prefix([1, 1, 3, 3]).device_indices.numel() == 2
    assert tree.match_prefix([1, 1, 2, 2]).device_indices.numel() == 4
    assert alloc.available_size() == 16 - 4
    tree.check_integrity()


def test_locked_nodes_survive_eviction():
    alloc, tree = make(16)
    put(alloc, tree, [1, 1, 2, 2])
    node = tree.match_prefix([1, 1, 2, 2]).last_device_node
    tree.inc_lock_ref(node)
    assert (tree.evictable_size(), tree.protected_size()) == (0, 4)
    assert tree.evict(100) == 0
    tree.dec_lock_ref(node)
    assert tree.evict(100) == 4
    tree.check_integrity()
    alloc.check_integrity()


def test_digest_ignores_slot_indices():
    a1, t1 = make()
    a2, t2 = make()
    a2.alloc(8)  # shift rank 2's slots
    for key in ([1, 2, 3, 4], [1, 2, 5, 6]):
        put(a1, t1, key)
        put(a2, t2, key)
    assert t1.tree_digest() == t2.tree_digest()
    put(a2, t2, [7, 7])
    assert t1.tree_digest() != t2.tree_digest()


def test_unaligned_insert_raises():
    alloc, tree = make()
    try:
        tree.insert([1, 2, 3], torch.arange(3))
    except ValueError as exc:
        assert "page aligned" in str(exc)
    else:
        raise AssertionError("unaligned insert accepted")


keys = st.lists(st.integers(0, 2), min_size=1, max_size=4).map(
    lambda ps: [t for p in ps for t in (p, p)]
)


class RadixMachine(RuleBasedStateMachine):
    """The tree must agree with a plain set-of-prefixes model, whatever the operation order."""

    def __init__(self) -> None:
        super().__init__()
        self.alloc, self.tree = make(32)
        self.model: set[tuple[int, ...]] = set()  # every cached page-aligned prefix
        self.locked: list = []

    def _model_match(self, key: list[int]) -> int:
        return max((len(p) for p in self.model if tuple(key[: len(p)]) == p), default=0)

    @rule(key=keys)
    def insert(self, key):
        value = self.alloc.alloc(len(key))
        if value is None:
            return
        expected = self._model_match(key)
        assert self.tree.insert(key, value) == expected
        self.alloc.free(value[:expected])
        self.model.update(tuple(key[:i]) for i in range(PAGE, len(key) + 1, PAGE))

    @rule(key=keys)
    def match(self, key):
        assert self.tree.match_prefix(key).device_indices.numel() == self._model_match(key)

    @rule(key=keys)
    def lock(self, key):
        node = self.tree.match_prefix(key).last_device_node
        self.tree.inc_lock_ref(node)
        self.locked.append(node)

    @rule()
    def unlock(self):
        if self.locked:
            self.tree.dec_lock_ref(self.locked.pop())

    @rule(n=st.integers(1, 12))
    def evict(self, n):
        before = self.tree.total_size()
        freed = self.tree.evict(n)
        assert self.tree.total_size() == before - freed
        assert freed >= min(n, 1) or self.tree.evictable_size() == 0
        self.model = {p for p in self.model if self._still_cached(p)}

    def _still_cached(self, prefix):
        return self.tree.match_prefix(list(prefix)).device_indices.numel() == len(prefix)

    @invariant()
    def integrity(self):
        self.tree.check_integrity()
        self.alloc.check_integrity()
        assert self.tree.total_size() + self.alloc.available_size() == 32


TestRadixMachine = RadixMachine.TestCase
TestRadixMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
