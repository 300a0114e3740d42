"""load_back under write_back: the eviction that makes device room writes the victims back to
host and may evict host leaves; the pages being loaded must not be among them."""

from __future__ import annotations

import torch
from hicache_helpers import make_bundle, put, settle

A, B, C = [1, 1, 2, 2], [3, 3, 4, 4], [5, 5, 6, 6]


def _fill(bundle, slots: torch.Tensor, value: float) -> None:
    for buf in bundle.kv_pool.k_buffer:
        buf[slots] = value


def test_pages_being_loaded_survive_the_write_back_eviction_they_cause():
    # device 8 tokens, host 4 tokens: A fills the host once it is written back
    b = make_bundle(
        "ack-count=local", hicache_write_policy="write_back", max_total_tokens=8, hicache_ratio=0.5
    )
    try:
        tree = b.tree_cache
        put(b, A)
        _fill(b, tree.match_prefix(A).device_indices, 7.0)
        assert tree.evict(4) == 4 and tree.match_prefix(A).host_hit_length == 4
        for key, value in ((B, 8.0), (C, 9.0)):
            put(b, key)
            _fill(b, tree.match_prefix(key).device_indices, value)
        assert b.allocator.available_size() == 0
        match = tree.match_prefix(A)
        quota = b.allocator.available_size() + tree.evictable_size()
        indices, _ = tree.init_load_back(match, quota)  # evicts B: its write-back finds no host
        assert len(indices) == len(A), "A was loaded back"
        tree.ready_to_load_host_cache()
        settle(b)
        loaded = b.kv_pool.k_buffer[0][indices]
        assert torch.all(loaded == 7.0), f"A's pages came back as {loaded.unique().tolist()}"
        assert tree.match_prefix(B).device_indices.numel() == 0, "B had no host room: dropped"
    finally:
        b.shutdown()
