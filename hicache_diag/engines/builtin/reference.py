"""The builtin engine's no-cache single-process reference (ours): same model, full recompute per
token. Each generated token is recomputed from the whole sequence with no KV reuse, no PP, no
TP, so it is the function the runtime must compute. With each token we record the gap between
the top two logits, which lets `compare_outputs` (trials/reference.py) tolerate greedy ties.
"""

from __future__ import annotations

from typing import Any

import torch

from hicache_diag.engines.builtin.runtime.model_executor.forward_batch_info import (
    ForwardBatch,
    ForwardMode,
)
from hicache_diag.engines.builtin.runtime.model_executor.models.tiny_llama import (
    TinyLlamaForCausalLM,
)
from hicache_diag.engines.builtin.runtime.server_args import ModelConfig


class _ScratchKVPool:
    """A contiguous KV store for one sequence: slot i holds token i."""

    def __init__(self, cfg: ModelConfig, size: int) -> None:
        shape = (size, cfg.num_heads, cfg.head_dim)
        self.k = {lid: torch.zeros(shape) for lid in range(cfg.num_layers)}
        self.v = {lid: torch.zeros(shape) for lid in range(cfg.num_layers)}

    def get_kv_buffer(self, layer_id: int):
        return self.k[layer_id], self.v[layer_id]

    def set_kv_buffer(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        self.k[layer_id][loc] = k
        self.v[layer_id][loc] = v


@torch.no_grad()
def generate(model: TinyLlamaForCausalLM, prompt: list[int], max_new_tokens: int):
    tokens, out, gaps = list(prompt), [], []
    for _ in range(max_new_tokens):
        n = len(tokens)
        pool = _ScratchKVPool(model.cfg, n)
        idx = torch.arange(n)
        fb = ForwardBatch(
            ForwardMode.EXTEND, torch.tensor(tokens), idx.clone(), idx, [n], [n], [idx]
        )
        logits = model.forward(fb, None, pool)[0]
        top2 = logits.topk(2).values
        tok = int(logits.argmax())
        out.append(tok)
        gaps.append(float(top2[0] - top2[1]))
        tokens.append(tok)
    return out, gaps


def compute_reference(cfg: ModelConfig, requests: list[Any]) -> dict[str, dict[str, list]]:
    model = TinyLlamaForCausalLM(cfg, range(cfg.num_layers), first=True, last=True)
    ref = {}
    for req in requests:
        tokens, gaps = generate(model, list(req.input_ids), req.max_new_tokens)
        ref[req.rid] = {"tokens": tokens, "top2_gap": gaps}
    return ref
