"""Mirrors sglang/srt/model_executor/model_runner.py: run this stage's layers for one batch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from hicache_diag.engines.builtin.runtime.model_executor.forward_batch_info import ForwardBatch
from hicache_diag.engines.builtin.runtime.model_executor.models.tiny_llama import (
    TinyLlamaForCausalLM,
)
from hicache_diag.engines.builtin.runtime.server_args import ServerArgs


@dataclass(slots=True)
class ForwardResult:
    """hidden_states for the next stage (non-last), or next_token_ids (last stage)."""

    hidden_states: torch.Tensor | None = None
    next_token_ids: torch.Tensor | None = None


class ModelRunner:
    def __init__(self, server_args: ServerArgs, pp_rank: int, tp_rank: int, kv_pool: Any, comm):
        self.kv_pool = kv_pool
        self.model = TinyLlamaForCausalLM(
            server_args.model,
            server_args.layers_of_stage(pp_rank),
            first=pp_rank == 0,
            last=pp_rank == server_args.pp_size - 1,
            tp_rank=tp_rank,
            tp_size=server_args.tp_size,
            # tensor_model_parallel_all_reduce: the TP *device* group, never HiCache's cpu group
            tp_all_reduce=comm.tp_all_reduce_sum if comm is not None else None,
        )

    @torch.no_grad()
    def forward(self, fb: ForwardBatch, proxy: dict[str, torch.Tensor] | None) -> ForwardResult:
        # The pool waits per layer for this batch's load (LayerDoneCounter consumer); -1 means
        # no load, so an older batch's index never makes this forward wait.
        counter = getattr(self.kv_pool, "layer_transfer_counter", None)
        if counter is not None:
            counter.set_consumer(fb.hicache_consumer_index)
        hidden = proxy["hidden_states"] if proxy is not None else None
        out = self.model.forward(fb, hidden, self.kv_pool)
        if self.model.lm_head is None:
            return ForwardResult(hidden_states=out)
        # Greedy decode: argmax of the last token's logits per request.
        return ForwardResult(next_token_ids=out.argmax(dim=-1))
