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


def compute_reference(python: str, model_dir: Path,
                      requests: list[Any]) -> dict[str, dict[str, list]]:  # fmt: skip
    """rid -> {tokens, top2_gap} (the tie tolerance is diagnosis/outputs.py's, per engine)."""
    if not requests:
        return {}
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
        return json.loads(out.read_text())
