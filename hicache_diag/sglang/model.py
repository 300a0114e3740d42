"""The default model for `--engine sglang`: a tiny random-weight Llama and a BPE tokenizer,
built offline and deterministically, cached by content so every run reuses one directory.

Nothing is downloaded: the weights come from a seeded generator, the tokenizer is trained on a
fixed text shipped in this module. A real model directory (`--model DIR`) replaces all of this.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from hicache_diag.errors import UsageError

BUILDER_VERSION = 1

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


@dataclass(frozen=True, slots=True)
class TinyModelSpec:
    """Llama shape of the default model (hidden 64, 4 layers, 4 heads: seconds to start on CPU)."""

    vocab_size: int = 512
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 4
    max_position_embeddings: int = 2048
    weight_seed: int = 1234

    def digest(self) -> str:
        text = json.dumps({"v": BUILDER_VERSION, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def cache_root() -> Path:
    base = os.environ.get("HICACHE_DIAG_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "hicache-diag"
    )
    return Path(base)


def default_model_dir(spec: TinyModelSpec | None = None) -> Path:
    """The cached tiny model, built on first use (a second or two) and reused after."""
    spec = spec or TinyModelSpec()
    target = cache_root() / "models" / f"tiny-llama-{spec.digest()}"
    if (target / "config.json").is_file() and (target / "tokenizer.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build in a scratch dir and rename, so two first runs at once never see half a model.
    scratch = Path(tempfile.mkdtemp(prefix=".build-", dir=target.parent))
    try:
        build_tiny_model(scratch, spec)
        try:
            scratch.rename(target)
        except OSError:  # another process won the race; its copy is identical
            shutil.rmtree(scratch, ignore_errors=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def build_tiny_model(out: Path, spec: TinyModelSpec) -> None:
    _build_tokenizer(out, spec.vocab_size)
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


def _build_weights(out: Path, spec: TinyModelSpec) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    torch.manual_seed(spec.weight_seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    with torch.no_grad():  # wider than the init default, so greedy tokens are not near-ties
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.08)
    model.save_pretrained(out, safe_serialization=True)


def check_model_dir(path: str) -> Path:
    model = Path(path)
    if not (model / "config.json").is_file():
        raise UsageError(f"--model {path}: not a model directory (no config.json there)")
    return model
