"""Mirrors sglang/srt/mem_cache/allocator.py: page-granular allocator of device KV slots."""

from __future__ import annotations

from collections import deque

import torch


class TokenToKVPoolAllocator:
    """Hands out device KV slot indices one page at a time.

    `alloc(n)` takes `n // page_size` pages from the head of the free list and `free` appends to
    its tail, so two ranks that apply the same sequence of calls get the same indices. Scheduler
    thread only, except that the DMA engine's load path goes through the controller on that
    thread too.
    """

    def __init__(self, size: int, page_size: int) -> None:
        if page_size < 1 or size < page_size:
            raise ValueError(f"size {size} must hold at least one page of {page_size} tokens")
        self.size = size // page_size * page_size
        self.page_size = page_size
        self.num_pages = self.size // page_size
        self.free_pages: deque[int] = deque(range(self.num_pages))
        self._used: set[int] = set()

    def available_size(self) -> int:
        return len(self.free_pages) * self.page_size

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """`need_size` device slots (int64), or None when fewer pages are free."""
        if need_size % self.page_size:
            raise ValueError(f"alloc({need_size}) is not a multiple of page_size {self.page_size}")
        num = need_size // self.page_size
        if num > len(self.free_pages):
            return None
        pages = [self.free_pages.popleft() for _ in range(num)]
        self._used.update(pages)
        return self._slots_of(pages)

    def free(self, free_index: torch.Tensor) -> None:
        """Return whole pages; freeing a page twice or a foreign page raises ValueError."""
        if free_index.numel() == 0:
            return
        if free_index.numel() % self.page_size:
            raise ValueError(f"free of {free_index.numel()} slots is not page aligned")
        pages = (free_index[:: self.page_size] // self.page_size).tolist()
        bad = [p for p in pages if p not in self._used]
        if bad:
            raise ValueError(f"free of pages not allocated (double free?): {bad[:8]}")
        self._used.difference_update(pages)
        self.free_pages.extend(pages)

    def _slots_of(self, pages: list[int]) -> torch.Tensor:
        base = torch.tensor(pages, dtype=torch.int64).unsqueeze(1) * self.page_size
        return (base + torch.arange(self.page_size, dtype=torch.int64)).reshape(-1)

    def check_integrity(self) -> None:
        free = set(self.free_pages)
        assert len(free) == len(self.free_pages), (
            f"free list holds duplicates: {len(self.free_pages)} entries, {len(free)} distinct"
        )
        assert not (free & self._used), f"pages both free and used: {sorted(free & self._used)[:8]}"
        assert len(free) + len(self._used) == self.num_pages, (
            f"free {len(free)} + used {len(self._used)} != {self.num_pages} pages"
        )
