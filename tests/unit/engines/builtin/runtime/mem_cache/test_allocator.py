"""TokenToKVPoolAllocator and MHATokenToKVPool: pages, double frees, per-layer waits."""

from __future__ import annotations

import pytest
import torch

from hicache_diag.engines.builtin.runtime.mem_cache.allocator import TokenToKVPoolAllocator
from hicache_diag.engines.builtin.runtime.mem_cache.memory_pool import MHATokenToKVPool


def test_alloc_whole_pages_and_none_when_short():
    a = TokenToKVPoolAllocator(8, 4)
    first = a.alloc(4)
    assert first.tolist() == [0, 1, 2, 3] and first.dtype == torch.int64
    assert a.alloc(8) is None, "only one page left"
    assert a.available_size() == 4
    a.free(first)
    assert a.available_size() == 8
    a.check_integrity()


def test_unaligned_and_double_free_raise():
    a = TokenToKVPoolAllocator(8, 4)
    with pytest.raises(ValueError, match="multiple of page_size"):
        a.alloc(3)
    x = a.alloc(4)
    a.free(x)
    with pytest.raises(ValueError, match="double free"):
        a.free(x)


def test_kv_pool_set_get_and_waits_per_layer():
    pool = MHATokenToKVPool(8, range(2, 4), head_num=2, head_dim=3)
    loc = torch.tensor([1, 5])
    pool.set_kv_buffer(3, loc, torch.ones(2, 2, 3), torch.full((2, 2, 3), 2.0))
    waited = []

    class Counter:
        def wait_until(self, layer_index):
            waited.append(layer_index)

    pool.register_layer_transfer_counter(Counter())
    k, v = pool.get_kv_buffer(3)
    assert waited == [1], "layer 3 is local layer 1 on a stage holding layers 2..3"
    assert k[5].sum().item() == 6 and v[1].sum().item() == 12
    with pytest.raises(IndexError):
        pool.get_kv_buffer(0)
