"""The default model for `--engine sglang`: a tiny random-weight Llama and a BPE tokenizer,
built offline and deterministically, cached by content so every run reuses one directory.

Nothing is downloaded: the weights come from a seeded generator, the tokenizer is trained on a
fixed text. The build runs in the release's own interpreter (`plugin/offline.py`), which
has the `transformers` and `tokenizers` that release pins; the directory is keyed by the spec and
that `transformers` version, so releases that save differently never share one. A real model
directory (`--model DIR`) replaces all of this.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from hicache_diag.engines.sglang.cache import build_once, cache_root
from hicache_diag.errors import UsageError

BUILDER_VERSION = 1


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

    def digest(self, builder: str = "") -> str:
        text = json.dumps(
            {"v": BUILDER_VERSION, "builder": builder, **asdict(self)}, sort_keys=True
        )
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def default_model_dir(
    python: str, transformers: str | None, spec: TinyModelSpec | None = None
) -> Path:
    """The cached tiny model for the release at `python` (its `transformers` version), built
    there on first use (a few seconds) and reused after."""
    from hicache_diag.engines.sglang.bundle import run_offline
    from hicache_diag.engines.sglang.release import missing_package_error

    spec = spec or TinyModelSpec()
    target = cache_root() / "models" / f"tiny-llama-{spec.digest(transformers or '')}"

    def build(out: Path) -> None:
        done = run_offline(python, "build-model", str(out), json.dumps(asdict(spec)))
        if done.returncode != 0:
            raise missing_package_error(python, done.stderr) or UsageError(
                f"building the default model with {python} failed: {_last_line(done.stderr)}"
            )

    return build_once(target, build, marker="tokenizer.json")


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "(no output)"


def check_model_dir(path: str) -> Path:
    model = Path(path)
    if not (model / "config.json").is_file():
        raise UsageError(f"--model {path}: not a model directory (no config.json there)")
    return model
