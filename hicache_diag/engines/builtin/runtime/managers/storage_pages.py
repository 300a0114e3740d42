"""Flat page view of the host KV pool for L3 IO; ours (SGLang's HostKVCache has
`get_data_page` / `set_from_flat_data_page` / `get_dummy_flat_data_page` for the same job).

A page on disk is this rank's K and V for `page_size` tokens, layer by layer:
`[k(layer0), v(layer0), k(layer1), ...]`, each `[page_size, heads, head_dim]`, flattened.
"""

from __future__ import annotations

from typing import Any

import torch


class HostPages:
    """Reads and writes whole pages of a host pool that keeps per-layer `k_buffer` and
    `v_buffer` lists (tensors `[size, heads, head_dim]`). Called from the storage threads; the
    scheduler keeps the slots protected while an operation is in flight."""

    def __init__(self, host_pool: Any, page_size: int) -> None:
        self.host_pool, self.page_size = host_pool, page_size

    def _buffers(self) -> list[torch.Tensor]:
        k_buffer, v_buffer = self.host_pool.k_buffer, self.host_pool.v_buffer
        return [buf for pair in zip(k_buffer, v_buffer, strict=True) for buf in pair]

    def page_numel(self) -> int:
        return sum(self.page_size * buf[0].numel() for buf in self._buffers())

    def empty_page(self) -> torch.Tensor:
        first = self._buffers()[0]
        return torch.empty(self.page_numel(), dtype=first.dtype)

    def get_page(self, slots: torch.Tensor) -> torch.Tensor:
        self._check(slots)
        return torch.cat([buf[slots].reshape(-1) for buf in self._buffers()])

    def set_page(self, slots: torch.Tensor, data: torch.Tensor) -> None:
        self._check(slots)
        if data.numel() != self.page_numel():
            raise ValueError(f"page holds {data.numel()} values, expected {self.page_numel()}")
        offset = 0
        for buf in self._buffers():
            n = self.page_size * buf[0].numel()
            buf[slots] = data[offset : offset + n].view(self.page_size, *buf.shape[1:])
            offset += n

    def _check(self, slots: torch.Tensor) -> None:
        if slots.numel() != self.page_size:
            raise ValueError(f"a page is {self.page_size} slots, got {slots.numel()}")
