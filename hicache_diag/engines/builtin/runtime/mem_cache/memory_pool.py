"""Mirrors sglang/srt/mem_cache/memory_pool.py: the device (L1) KV pool, one K and V per layer."""

from __future__ import annotations

from typing import Protocol

import torch


class LayerWaiter(Protocol):
    def wait_until(self, layer_index: int) -> None: ...


class MHATokenToKVPool:
    """Per-layer K/V buffers `[size, head_num, head_dim]` for this stage's layers.

    When a `LayerDoneCounter` is registered, `get_kv_buffer(layer_id)` first waits for the
    in-flight host->device load of that layer (the batch's consumer index), so loading layer i+1
    overlaps computing layer i, as SGLang's `register_layer_transfer_counter` does. The DMA engine
    reads and writes `k_buffer` / `v_buffer` directly and never waits on itself.
    """

    def __init__(
        self,
        size: int,
        layer_ids: range,
        head_num: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> None:
        self.size, self.layer_ids = size, layer_ids
        self.head_num, self.head_dim, self.dtype = head_num, head_dim, dtype
        self.device = torch.device(device)
        shape = (size, head_num, head_dim)
        self.k_buffer = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in layer_ids]
        self.v_buffer = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in layer_ids]
        self.layer_transfer_counter: LayerWaiter | None = None

    @property
    def layer_num(self) -> int:
        return len(self.layer_ids)

    def _local(self, layer_id: int) -> int:
        if layer_id not in self.layer_ids:
            raise IndexError(f"layer {layer_id} is not on this stage ({self.layer_ids})")
        return layer_id - self.layer_ids.start

    def register_layer_transfer_counter(self, counter: LayerWaiter | None) -> None:
        self.layer_transfer_counter = counter

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = self._local(layer_id)
        if self.layer_transfer_counter is not None:
            self.layer_transfer_counter.wait_until(idx)
        return self.k_buffer[idx], self.v_buffer[idx]

    def set_kv_buffer(
        self, layer_id: int, loc: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor
    ) -> None:
        idx = self._local(layer_id)
        self.k_buffer[idx][loc] = cache_k.to(self.dtype)
        self.v_buffer[idx][loc] = cache_v.to(self.dtype)

    def bytes_per_token(self) -> int:
        return 2 * self.layer_num * self.head_num * self.head_dim * self.dtype.itemsize
