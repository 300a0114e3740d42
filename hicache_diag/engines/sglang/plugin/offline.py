"""Work done in the release's own interpreter, before and after a launch: building the tiny
model and computing the reference outputs.

Both need `transformers`, `tokenizers` and `torch`, which SGLang requires and hicache-diag does
not: running them in the release's python
(`python -m hicache_diag.engines.sglang.plugin.offline`, with
the plugin bundle on PYTHONPATH) keeps the tool's venv free of them and uses the versions the
release pins. Standard library at import; the heavy imports happen inside each task.

    python -m hicache_diag.engines.sglang.plugin.offline build-model OUT SPEC_JSON
    python -m hicache_diag.engines.sglang.plugin.offline reference MODEL_DIR REQUESTS_JSON OUT_JSON
    python -m hicache_diag.engines.sglang.plugin.offline reference-serve MODEL_DIR
        (one JSON list of requests a line on stdin, one JSON answer a line on stdout)
    python -m hicache_diag.engines.sglang.plugin.offline check-import KERNEL_NAMES_JSON
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# The tokenizer's training text: fixed, so the vocabulary (and every token id) is reproducible.
_CORPUS = (
    "pipeline parallel ranks agree on every batch they run together. "
    "the host cache keeps pages that the device pool evicted, and loads them back on a hit. "
    "a write through copies each new page to host memory; a write back waits for eviction. "
    "the storage tier holds pages in files named by the hash of their tokens. "
    "every scheduler step matches prefixes, evicts leaves, loads back and launches a forward. "
    "when two stages count a different number of tokens the shapes do not match and it fails. "
    "when one rank waits for a message that never comes, its peers wait too, and it hangs. "
    "the quick brown fox jumps over the lazy dog while the radix tree splits a node in two. "
    "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 32 64 128 256 512 1024 2048 4096 8192. "
)

# Exit status of a task whose interpreter lacks a package it needs (the caller names it).
MISSING_PACKAGE = 3


def _prepare() -> None:
    """transformers imports torchvision when it is there; on a CPU host its only build is a
    CUDA one that fails at import unless its meta registrations are emptied first."""
    from hicache_diag.engines.sglang.plugin.shims import neutralise_torchvision_meta

    neutralise_torchvision_meta()


def build_model(out: Path, spec: dict) -> None:
    _prepare()
    _build_tokenizer(out, int(spec["vocab_size"]))
    _build_weights(out, spec)


def _build_tokenizer(out: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    fast.save_pretrained(out)


def _build_weights(out: Path, spec: dict) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=spec["vocab_size"],
        hidden_size=spec["hidden_size"],
        intermediate_size=spec["intermediate_size"],
        num_hidden_layers=spec["num_hidden_layers"],
        num_attention_heads=spec["num_attention_heads"],
        num_key_value_heads=spec["num_key_value_heads"],
        max_position_embeddings=spec["max_position_embeddings"],
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    torch.manual_seed(spec["weight_seed"])
    model = LlamaForCausalLM(config).to(torch.float32)
    with torch.no_grad():  # wider than the init default, so greedy tokens are not near-ties
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.08)
    model.save_pretrained(out, safe_serialization=True)


def reference(model_dir: Path, requests: list[dict]) -> dict[str, dict[str, list]]:
    """Greedy, float32, the whole sequence recomputed per token (no cache of any kind), with
    each token's top-2 logit gap so that the comparison can tolerate greedy ties."""
    if not requests:
        return {}
    return _greedy(_load(model_dir), requests)


def serve_reference(model_dir: Path) -> None:
    """`reference` for many batches on one loaded model: a warm pool's trials each ask for new
    prompts, and the interpreter's imports were most of each one-shot task."""
    import os

    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever the libraries print goes to stderr, never into an answer
    model = _load(model_dir)
    for line in sys.stdin:
        answers.write(json.dumps(_greedy(model, json.loads(line))) + "\n")
        answers.flush()


def _load(model_dir: Path):
    _prepare()
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the run panel is ours; no third-party progress bars
    hf_logging.set_verbosity_error()
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    except TypeError:  # transformers 4.x names it torch_dtype
        model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    model.eval()
    return model


def _greedy(model, requests: list[dict]) -> dict[str, dict[str, list]]:
    import torch

    ref = {}
    with torch.no_grad():
        for req in requests:
            tokens, out, gaps = list(req["input_ids"]), [], []
            for _ in range(int(req["max_new_tokens"])):
                logits = model(torch.tensor([tokens])).logits[0, -1]
                top2 = logits.topk(2).values
                tok = int(logits.argmax())
                out.append(tok)
                gaps.append(float(top2[0] - top2[1]))
                tokens.append(tok)
            ref[req["rid"]] = {"tokens": out, "top2_gap": gaps}
    return ref


def check_import(kernel_names: dict[str, list[str]]) -> None:
    """Import the scheduler module as a launch on this CPU host would (same shims): proof that
    the release's own requirements are in place."""
    import importlib
    import os

    from hicache_diag.engines.sglang.plugin.shims import install_cpu_shims

    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    install_cpu_shims(kernel_names)
    importlib.import_module("sglang.srt.managers.scheduler")


def main(argv: list[str]) -> int:
    try:
        if argv[:1] == ["build-model"] and len(argv) == 3:
            build_model(Path(argv[1]), json.loads(argv[2]))
        elif argv[:1] == ["reference"] and len(argv) == 4:
            requests = json.loads(Path(argv[2]).read_text())
            Path(argv[3]).write_text(json.dumps(reference(Path(argv[1]), requests)))
        elif argv[:1] == ["reference-serve"] and len(argv) == 2:
            serve_reference(Path(argv[1]))
        elif argv[:1] == ["check-import"] and len(argv) == 2:
            check_import(json.loads(argv[1]))
        else:
            sys.stderr.write(f"usage: see {__name__}'s docstring (got {argv})\n")
            return 2
    except ModuleNotFoundError as exc:
        # One line the caller turns into "install it with ...": which module is missing.
        sys.stderr.write(f"missing-module: {exc.name}\n")
        return MISSING_PACKAGE
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
