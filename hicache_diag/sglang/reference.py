"""Reference outputs for `--engine sglang`: the same weights through `transformers`, float32,
greedy, no cache of any kind, with each token's top-2 logit gap so that `compare_outputs` can
tolerate greedy ties (harness/reference.py). Computed in the release's own interpreter
(`sglang_plugin/offline.py reference`), which has the `transformers` that served the model.

A request's reference depends only on the weights, the interpreter that computes it and the
request's tokens, so each is kept in the tool's cache under a key of exactly those
(`reference/<model key>/<request key>.json`) and computed once: a bisect or a rate check asks
the same prompts trial after trial, and the reference was most of a trial's evidence phase
(bench/sglang_trial_cost.py)."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from hicache_diag.errors import UsageError


def _model_key(python: str, model_dir: Path) -> str:
    """The interpreter (its transformers) and the model dir's files: names, sizes, mtimes."""
    files = sorted(
        (p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in model_dir.iterdir() if p.is_file()
    )
    text = json.dumps([os.path.realpath(python), str(model_dir.resolve()), files])
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _request_key(request: Any) -> str:
    text = json.dumps([list(request.input_ids), request.max_new_tokens])
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _store(python: str, model_dir: Path) -> Path:
    from hicache_diag.sglang.cache import cache_root

    return cache_root() / "reference" / _model_key(python, model_dir)


def _compute(python: str, model_dir: Path, requests: list[Any]) -> dict[str, dict[str, list]]:
    from hicache_diag.sglang.bundle import run_offline
    from hicache_diag.sglang.release import missing_package_error

    with tempfile.TemporaryDirectory(prefix="hicache-diag-ref-") as tmp:
        reqs, out = Path(tmp) / "requests.json", Path(tmp) / "reference.json"
        reqs.write_text(
            json.dumps(
                [
                    {
                        "rid": r.rid,
                        "input_ids": list(r.input_ids),
                        "max_new_tokens": r.max_new_tokens,
                    }
                    for r in requests
                ]
            )
        )
        done = run_offline(python, "reference", str(model_dir), str(reqs), str(out))
        if done.returncode != 0:
            raise missing_package_error(python, done.stderr) or UsageError(
                f"computing the reference outputs with {python} failed: "
                f"{done.stderr.strip().splitlines()[-1:] or '(no output)'}"
            )
        return json.loads(out.read_text())


def _keep(store: Path, key: str, value: dict[str, list]) -> None:
    store.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".ref-", dir=store)
    with os.fdopen(fd, "w") as fh:
        json.dump(value, fh)
    os.replace(tmp, store / f"{key}.json")


def compute_reference(
    python: str, model_dir: Path, requests: list[Any]
) -> dict[str, dict[str, list]]:
    """rid -> {tokens, top2_gap} (the tie tolerance is diagnosis/outputs.py's, per engine);
    only the requests the cache lacks are computed."""
    if not requests:
        return {}
    store = _store(python, Path(model_dir))
    out: dict[str, dict[str, list]] = {}
    missing = []
    for request in requests:
        try:
            out[request.rid] = json.loads((store / f"{_request_key(request)}.json").read_text())
        except (OSError, ValueError):
            missing.append(request)
    if missing:
        fresh = _compute(python, Path(model_dir), missing)
        for request in missing:
            out[request.rid] = fresh[request.rid]
            _keep(store, _request_key(request), fresh[request.rid])
    return out
