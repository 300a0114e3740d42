"""Mirrors sglang/srt/models/llama.py at toy scale: a deterministic decoder split across stages.

Every weight derives from `ModelConfig.weight_seed` and the layer's global id, so any PP split and
any TP degree compute the same function (up to float summation order). TP slices heads and the MLP
intermediate (column parallel) and sums the row-parallel outputs over the TP group.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from hicache_diag.engines.builtin.runtime.model_executor.forward_batch_info import ForwardBatch
from hicache_diag.engines.builtin.runtime.server_args import ModelConfig

if TYPE_CHECKING:
    from hicache_diag.engines.builtin.runtime.mem_cache.memory_pool import MHATokenToKVPool

ROPE_THETA = 10000.0
RMS_EPS = 1e-6


def _rand(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, dtype=torch.float32) / math.sqrt(shape[-1])


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    var = x.pow(2).mean(-1, keepdim=True)
    return x * torch.rsqrt(var + RMS_EPS) * weight


class RotaryEmbedding:
    """forward_native: reshapes with the *local* token count, as SGLang's RoPE does."""

    def __init__(self, head_dim: int) -> None:
        self.head_size = head_dim
        self.inv_freq = 1.0 / (ROPE_THETA ** (torch.arange(0, head_dim, 2).float() / head_dim))

    def __call__(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor):
        num_tokens = positions.shape[0]
        # The downstream stage's own token count meets the upstream hidden states here:
        # a mismatch raises PyTorch's "shape '[N, -1, D]' is invalid for input of size M".
        query = query.view(num_tokens, -1, self.head_size)
        key = key.view(num_tokens, -1, self.head_size)
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        cos, sin = freqs.cos()[:, None, :], freqs.sin()[:, None, :]
        return self._rotate(query, cos, sin), self._rotate(key, cos, sin)

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


@dataclass(slots=True)
class LayerWeights:
    input_norm: torch.Tensor
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    o: torch.Tensor
    post_norm: torch.Tensor
    gate: torch.Tensor
    up: torch.Tensor
    down: torch.Tensor


def make_layer(cfg: ModelConfig, layer_id: int, tp_rank: int, tp_size: int) -> LayerWeights:
    """Full weights from the layer's seed, then this TP rank's slice."""
    g = _gen(cfg.weight_seed * 1009 + layer_id + 1)
    h, qd, inter = cfg.hidden_size, cfg.num_heads * cfg.head_dim, 2 * cfg.hidden_size
    full = {
        "q": _rand(g, qd, h),
        "k": _rand(g, qd, h),
        "v": _rand(g, qd, h),
        "o": _rand(g, h, qd),
        "gate": _rand(g, inter, h),
        "up": _rand(g, inter, h),
        "down": _rand(g, h, inter),
    }
    norms = 1.0 + 0.1 * torch.randn(2, h, generator=g)
    qs, ms = qd // tp_size, inter // tp_size
    col = slice(tp_rank * qs, (tp_rank + 1) * qs)
    mcol = slice(tp_rank * ms, (tp_rank + 1) * ms)
    return LayerWeights(
        input_norm=norms[0],
        q=full["q"][col],
        k=full["k"][col],
        v=full["v"][col],
        o=full["o"][:, col].contiguous(),
        post_norm=norms[1],
        gate=full["gate"][mcol],
        up=full["up"][mcol],
        down=full["down"][:, mcol].contiguous(),
    )


class TinyLlamaForCausalLM:
    """The layers `layer_ids` of the model. `embed` on the first stage, `lm_head` on the last.

    kv_pool: `get_kv_buffer(layer_id)` (may wait for an in-flight load of that layer) and
    `set_kv_buffer(layer_id, loc, k, v)`. tp_all_reduce: sums row-parallel partial outputs.
    """

    def __init__(
        self,
        cfg: ModelConfig,
        layer_ids: range,
        *,
        first: bool,
        last: bool,
        tp_rank: int = 0,
        tp_size: int = 1,
        tp_all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        self.cfg, self.layer_ids = cfg, layer_ids
        self.local_heads = cfg.num_heads // tp_size
        self.layers = {lid: make_layer(cfg, lid, tp_rank, tp_size) for lid in layer_ids}
        self.rotary_emb = RotaryEmbedding(cfg.head_dim)
        self.tp_all_reduce = tp_all_reduce or (lambda t: t)
        g = _gen(cfg.weight_seed * 1009)
        embed = torch.randn(cfg.vocab_size, cfg.hidden_size, generator=g)
        self.embed = embed if first else None
        self.final_norm = 1.0 + 0.1 * torch.randn(cfg.hidden_size, generator=g) if last else None
        self.lm_head = embed if last else None  # tied embeddings

    def forward(
        self, fb: ForwardBatch, hidden_states: torch.Tensor | None, kv_pool: MHATokenToKVPool
    ):
        """Returns hidden states (non-last stage) or per-request last-token logits (last)."""
        if self.embed is not None:
            hidden_states = self.embed[fb.input_ids]
        for lid in self.layer_ids:
            hidden_states = self._layer(lid, fb, hidden_states, kv_pool)
        if self.lm_head is None:
            return hidden_states
        last_idx = torch.tensor(fb.extend_seq_lens).cumsum(0) - 1
        normed = rms_norm(hidden_states[last_idx], self.final_norm)
        return normed @ self.lm_head.t()

    def _layer(
        self, lid: int, fb: ForwardBatch, x: torch.Tensor, kv_pool: MHATokenToKVPool
    ) -> torch.Tensor:
        w = self.layers[lid]
        h = rms_norm(x, w.input_norm)
        q, k, v = h @ w.q.t(), h @ w.k.t(), h @ w.v.t()
        q, k = self.rotary_emb(fb.positions, q, k)
        attn = self._attention(lid, fb, q, k, v.view(k.shape), kv_pool)
        x = x + self.tp_all_reduce(attn @ w.o.t())
        h = rms_norm(x, w.post_norm)
        mlp = (torch.nn.functional.silu(h @ w.gate.t()) * (h @ w.up.t())) @ w.down.t()
        return x + self.tp_all_reduce(mlp)

    def _attention(self, lid, fb: ForwardBatch, q, k, v, kv_pool) -> torch.Tensor:
        kv_pool.set_kv_buffer(lid, fb.out_cache_loc, k, v)
        k_buf, v_buf = kv_pool.get_kv_buffer(lid)  # waits here for a layer-wise load-back
        outs, start = [], 0
        scale = 1.0 / math.sqrt(self.cfg.head_dim)
        for seq_len, ext, kv_idx in zip(
            fb.seq_lens, fb.extend_seq_lens, fb.req_kv_indices, strict=True
        ):
            qi = q[start : start + ext].transpose(0, 1)  # [heads, ext, hd]
            keys = k_buf[kv_idx[:seq_len]].transpose(0, 1)
            vals = v_buf[kv_idx[:seq_len]].transpose(0, 1)
            scores = (qi @ keys.transpose(1, 2)) * scale
            q_pos = torch.arange(seq_len - ext, seq_len)[:, None]
            mask = torch.arange(seq_len)[None, :] > q_pos
            probs = scores.masked_fill(mask, float("-inf")).softmax(-1)
            outs.append((probs @ vals).transpose(0, 1).reshape(ext, -1))
            start += ext
        return torch.cat(outs, dim=0)
