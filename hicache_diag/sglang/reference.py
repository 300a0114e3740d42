"""Reference outputs for `--engine sglang`: the same weights through `transformers`, float32,
greedy, no cache of any kind, with each token's top-2 logit gap so that `compare_outputs` can
tolerate greedy ties (harness/reference.py). Computed in the release's own interpreter
(`sglang_plugin/offline.py reference`), which has the `transformers` that served the model."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from hicache_diag.errors import UsageError

# A greedy token whose reference top-2 gap is under this may go either way. SGLang's CPU path
# (torch_native attention over a cached prefix, float32) is further from `transformers` than our
# runtime is: 0.5.19 runs flipped tokens at reference gaps of 0.00115 and 0.0019 (PP2, with and
# without L3, the rest of each output identical), where our runtime's 1e-3 would call them wrong.
TIE_TOLERANCE = 5e-3


def compute_reference(python: str, model_dir: Path,
                      requests: list[Any]) -> dict[str, Any]:  # fmt: skip
    """rid -> {tokens, top2_gap}, and `tolerance`: the gap under which a token is a tie."""
    if not requests:
        return {"tolerance": TIE_TOLERANCE}
    from hicache_diag.sglang.bundle import run_offline
    from hicache_diag.sglang.install import missing_package_error

    with tempfile.TemporaryDirectory(prefix="hicache-diag-ref-") as tmp:
        reqs, out = Path(tmp) / "requests.json", Path(tmp) / "reference.json"
        reqs.write_text(json.dumps([
            {"rid": r.rid, "input_ids": list(r.input_ids), "max_new_tokens": r.max_new_tokens}
            for r in requests
        ]))  # fmt: skip
        done = run_offline(python, "reference", str(model_dir), str(reqs), str(out))
        if done.returncode != 0:
            raise missing_package_error(python, done.stderr) or UsageError(
                f"computing the reference outputs with {python} failed: "
                f"{done.stderr.strip().splitlines()[-1:] or '(no output)'}"
            )
        return {**json.loads(out.read_text()), "tolerance": TIE_TOLERANCE}
