"""Mirrors sglang/srt/model_executor/forward_batch_info.py: what one forward pass computes."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch


class ForwardMode(str, enum.Enum):
    EXTEND = "extend"
    DECODE = "decode"

    def is_extend(self) -> bool:
        return self is ForwardMode.EXTEND

    def is_decode(self) -> bool:
        return self is ForwardMode.DECODE


@dataclass(slots=True)
class ForwardBatch:
    """Token-flat inputs of one batch on this stage.

    input_ids/positions/out_cache_loc: one entry per token this stage computes (all requests
    concatenated). seq_lens, extend_seq_lens: per request. req_kv_indices: per request, the KV
    slots of its whole sequence so far (prefix + new tokens). hicache_consumer_index: the load
    the forward waits on layer by layer (-1: none).
    """

    forward_mode: ForwardMode
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    seq_lens: list[int]
    extend_seq_lens: list[int]
    req_kv_indices: list[torch.Tensor]
    hicache_consumer_index: int = -1

    @property
    def batch_size(self) -> int:
        return len(self.seq_lens)
