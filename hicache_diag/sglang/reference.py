"""Reference outputs for `--engine sglang`: the same weights through `transformers`, float32,
greedy, the whole sequence recomputed per token (no cache of any kind), with each token's top-2
logit gap so that `compare_outputs` can tolerate greedy ties (harness/reference.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def compute_reference(model_dir: Path, requests: list[Any]) -> dict[str, dict[str, list]]:
    if not requests:
        return {}
    from hicache_diag.sglang_plugin.shims import neutralise_torchvision_meta

    neutralise_torchvision_meta()  # transformers imports torchvision when it is installed
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the run panel is ours; no third-party progress bars
    hf_logging.set_verbosity_error()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    ref = {}
    with torch.no_grad():
        for req in requests:
            tokens, out, gaps = list(req.input_ids), [], []
            for _ in range(req.max_new_tokens):
                logits = model(torch.tensor([tokens])).logits[0, -1]
                top2 = logits.topk(2).values
                tok = int(logits.argmax())
                out.append(tok)
                gaps.append(float(top2[0] - top2[1]))
                tokens.append(tok)
            ref[req.rid] = {"tokens": out, "top2_gap": gaps}
    return ref
