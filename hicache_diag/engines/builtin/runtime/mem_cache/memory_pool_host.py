"""Mirrors sglang/srt/mem_cache/memory_pool_host.py: the L2 host KV pool (HostKVCache)."""

from __future__ import annotations

import threading
from collections import deque
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from hicache_diag.faults.hooks import Hooks


class HostKVCache:
    """Fixed token capacity of host K/V, layer-first `[layer_num, size, head_num, head_dim]`.

    `alloc` returns the head of the free list and `free` appends at the tail, as SGLang does, so
    host indices differ across ranks even when counts agree (compare counts, never indices).
    `alloc` also returns None when the `host_alloc` hook says no (the host-alloc-fail fault).
    Called from the scheduler thread; the DMA thread only touches the buffers. The lock mirrors
    SGLang's `@synchronized` for the storage threads.
    """

    def __init__(
        self,
        size: int,
        page_size: int,
        layer_num: int,
        head_num: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        hooks: Hooks | None = None,
    ) -> None:
        if size < page_size:
            raise ValueError(f"host pool of {size} tokens holds less than one page ({page_size})")
        self.size = size // page_size * page_size
        self.page_size, self.hooks = page_size, hooks
        self.layer_num, self.head_num, self.head_dim, self.dtype = (
            layer_num,
            head_num,
            head_dim,
            dtype,
        )
        shape = (layer_num, self.size, head_num, head_dim)
        self.k_buffer = torch.zeros(shape, dtype=dtype)
        self.v_buffer = torch.zeros(shape, dtype=dtype)
        self.free_pages: deque[int] = deque(range(self.size // page_size))
        self._used: set[int] = set()
        self.lock = threading.RLock()
        self.alloc_failed = 0  # allocs refused, ever (a full pool or the host_alloc hook)
        self._failed_seen = 0

    def available_size(self) -> int:
        with self.lock:
            return len(self.free_pages) * self.page_size

    def alloc(self, need_size: int) -> torch.Tensor | None:
        if need_size % self.page_size:
            raise ValueError(f"host alloc({need_size}) not a multiple of page {self.page_size}")
        with self.lock:
            num = need_size // self.page_size
            allowed = self.hooks is None or self.hooks.apply(
                "host_alloc", True, num_tokens=need_size
            )
            if num > len(self.free_pages) or not allowed:
                self.alloc_failed += 1
                return None
            pages = [self.free_pages.popleft() for _ in range(num)]
            self._used.update(pages)
        base = torch.tensor(pages, dtype=torch.int64).unsqueeze(1) * self.page_size
        return (base + torch.arange(self.page_size, dtype=torch.int64)).reshape(-1)

    def take_alloc_failed(self) -> int:
        """Allocs refused since the last call (the recorder's per-step count)."""
        with self.lock:
            n, self._failed_seen = self.alloc_failed - self._failed_seen, self.alloc_failed
        return n

    def free(self, indices: torch.Tensor) -> int:
        if indices.numel() % self.page_size:
            raise ValueError(f"host free of {indices.numel()} slots is not page aligned")
        pages = (indices[:: self.page_size] // self.page_size).tolist()
        with self.lock:
            bad = [p for p in pages if p not in self._used]
            if bad:
                raise ValueError(f"host free of pages not allocated (double free?): {bad[:8]}")
            self._used.difference_update(pages)
            self.free_pages.extend(pages)
        return indices.numel()

    def check_integrity(self) -> None:
        with self.lock:
            free = set(self.free_pages)
            total = self.size // self.page_size
            assert len(free) == len(self.free_pages), "host free list holds duplicates"
            assert not (free & self._used), (
                f"host pages both free and used: {len(free & self._used)}"
            )
            assert len(free) + len(self._used) == total, (
                f"host free {len(free)} + used {len(self._used)} != {total} pages"
            )
