"""Mirrors sglang/srt/managers/schedule_batch.py: `Req` and `ScheduleBatch`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from hicache_diag.engines.builtin.runtime.model_executor.forward_batch_info import (
    ForwardBatch,
    ForwardMode,
)

_EMPTY = torch.empty(0, dtype=torch.int64)


@dataclass(eq=False)
class Req:
    """One request. prefix_indices: device KV slots shared with the tree (locked via last_node);
    alloc_slots: whole pages this request allocated for the rest of its sequence."""

    rid: str
    origin_input_ids: list[int]
    max_new_tokens: int
    output_ids: list[int] = field(default_factory=list)
    prefix_indices: torch.Tensor = field(default_factory=lambda: _EMPTY)
    alloc_slots: torch.Tensor = field(default_factory=lambda: _EMPTY)
    last_node: Any = None
    host_hit_length: int = 0
    host_loaded_length: int = 0
    l3_hit_length: int = 0
    finished: bool = False

    @property
    def fill_ids(self) -> list[int]:
        return self.origin_input_ids + self.output_ids

    @property
    def seqlen(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)

    def kv_indices(self) -> torch.Tensor:
        return torch.cat((self.prefix_indices, self.alloc_slots))

    def check_finished(self) -> bool:
        self.finished = len(self.output_ids) >= self.max_new_tokens
        return self.finished


@dataclass(eq=False)
class ScheduleBatch:
    """The requests one micro-batch slot runs, as every stage must build it identically."""

    reqs: list[Req]
    forward_mode: ForwardMode
    prefix_lens: list[int] = field(default_factory=list)
    hicache_consumer_index: int = -1

    def __bool__(self) -> bool:
        return bool(self.reqs)

    @property
    def rids(self) -> list[str]:
        return [r.rid for r in self.reqs]

    def extend_lens(self) -> list[int]:
        if self.forward_mode.is_decode():
            return [1] * len(self.reqs)
        return [r.seqlen - p for r, p in zip(self.reqs, self.prefix_lens, strict=True)]

    def build_forward_batch(self) -> ForwardBatch:
        ids, pos, locs, seq_lens, kvs = [], [], [], [], []
        ext_lens = self.extend_lens()
        for req, ext in zip(self.reqs, ext_lens, strict=True):
            fill, kv = req.fill_ids, req.kv_indices()
            start = len(fill) - ext
            ids.extend(fill[start:])
            pos.extend(range(start, len(fill)))
            locs.append(kv[start : len(fill)])
            seq_lens.append(len(fill))
            kvs.append(kv)
        return ForwardBatch(
            forward_mode=self.forward_mode,
            input_ids=torch.tensor(ids, dtype=torch.int64),
            positions=torch.tensor(pos, dtype=torch.int64),
            out_cache_loc=torch.cat(locs),
            seq_lens=seq_lens,
            extend_seq_lens=ext_lens,
            req_kv_indices=kvs,
            hicache_consumer_index=self.hicache_consumer_index,
        )
