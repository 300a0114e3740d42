"""Reference outputs for `--engine sglang`: the same weights through `transformers`, float32,
greedy, no cache of any kind, with each token's top-2 logit gap so that `compare_outputs` can
tolerate greedy ties (trials/reference.py). Computed in the release's own interpreter
(`engines/sglang/plugin/offline.py reference`), which has the `transformers` that served the model.

A request's reference depends only on the weights, the interpreter that computes it and the
request's tokens, so each is kept in the tool's cache under a key of exactly those
(`reference/<model key>/<request key>.json`) and computed once: a bisect or a rate check asks
the same prompts trial after trial, and the reference was most of a trial's evidence phase
(bench/sglang_trial_cost.py)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
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
    from hicache_diag.engines.sglang.cache import cache_root

    return cache_root() / "reference" / _model_key(python, model_dir)


def _payload(requests: list[Any]) -> list[dict[str, Any]]:
    return [
        {"rid": r.rid, "input_ids": list(r.input_ids), "max_new_tokens": r.max_new_tokens}
        for r in requests
    ]


def _failed(python: str, stderr: str) -> UsageError:
    from hicache_diag.engines.sglang.release import missing_package_error

    return missing_package_error(python, stderr) or UsageError(
        f"computing the reference outputs with {python} failed: "
        f"{stderr.strip().splitlines()[-1:] or '(no output)'}"
    )


def _compute(python: str, model_dir: Path, requests: list[Any]) -> dict[str, dict[str, list]]:
    from hicache_diag.engines.sglang.bundle import run_offline

    with tempfile.TemporaryDirectory(prefix="hicache-diag-ref-") as tmp:
        reqs, out = Path(tmp) / "requests.json", Path(tmp) / "reference.json"
        reqs.write_text(json.dumps(_payload(requests)))
        done = run_offline(python, "reference", str(model_dir), str(reqs), str(out))
        if done.returncode != 0:
            raise _failed(python, done.stderr)
        return json.loads(out.read_text())


class ReferenceWorker:
    """One `offline reference-serve` process per (interpreter, model), kept by a warm pool: its
    trials each bring new prompts, and a one-shot task paid the release's imports every time
    (28 s of a 44 s warm trial on 0.5.19 here). Started on first use; `close()` ends it."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.key: tuple[str, str] | None = None
        self._stderr = tempfile.TemporaryFile(mode="w+")

    def compute(self, python: str, model_dir: Path, requests: list[Any]):
        key = (python, str(model_dir))
        if self.proc is None or self.proc.poll() is not None or self.key != key:
            self.close()
            self._start(python, model_dir)
            self.key = key
        assert self.proc is not None and self.proc.stdin and self.proc.stdout
        try:
            self.proc.stdin.write(json.dumps(_payload(requests)) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except (BrokenPipeError, OSError):
            line = ""
        if not line:
            self.close()
            self._stderr.seek(0)
            raise _failed(python, self._stderr.read())
        return json.loads(line)

    def _start(self, python: str, model_dir: Path) -> None:
        from hicache_diag.engines.sglang.bundle import offline_launch

        self._stderr.seek(0)
        self._stderr.truncate()
        self.proc = subprocess.Popen(
            **offline_launch(python, "reference-serve", str(model_dir)),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )

    def close(self) -> None:
        if self.proc is not None:
            if self.proc.stdin:
                self.proc.stdin.close()  # EOF: the task returns
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            if self.proc.stdout:
                self.proc.stdout.close()
        self.proc = None


def _keep(store: Path, key: str, value: dict[str, list]) -> None:
    store.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".ref-", dir=store)
    with os.fdopen(fd, "w") as fh:
        json.dump(value, fh)
    os.replace(tmp, store / f"{key}.json")


def compute_reference(
    python: str, model_dir: Path, requests: list[Any], worker: ReferenceWorker | None = None
) -> dict[str, dict[str, list]]:
    """rid -> {tokens, top2_gap} (the tie tolerance is diagnosis/outputs.py's, per engine);
    only the requests the cache lacks are computed, by `worker` when one is kept."""
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
        if worker is not None:
            fresh = worker.compute(python, Path(model_dir), missing)
        else:
            fresh = _compute(python, Path(model_dir), missing)
        for request in missing:
            out[request.rid] = fresh[request.rid]
            _keep(store, _request_key(request), fresh[request.rid])
    return out
