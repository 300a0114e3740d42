"""The SGLang reference is computed once per (interpreter, model files, request tokens): a
second trial with the same prompts computes nothing, and any change of those is a miss."""

from __future__ import annotations

from pathlib import Path

import pytest

from hicache_diag.engines.sglang import reference
from hicache_diag.options.workloads import TokenizedGenerateReqInput as Req


@pytest.fixture
def computed(monkeypatch, tmp_path):
    """Counts what the release's interpreter is asked to compute (a unit test starts nothing)."""
    monkeypatch.setenv("HICACHE_DIAG_CACHE", str(tmp_path / "cache"))
    asked: list[list[str]] = []

    def fake(python, model_dir, requests):
        asked.append([r.rid for r in requests])
        return {r.rid: {"tokens": [len(r.input_ids)], "top2_gap": [0.5]} for r in requests}

    monkeypatch.setattr(reference, "_compute", fake)
    return asked


def _model(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text('{"vocab_size": 512}')
    return model


def test_a_second_trial_with_the_same_prompts_computes_nothing(computed, tmp_path):
    model = _model(tmp_path)
    first = [Req("r0", (1, 2, 3), 4), Req("r1", (5, 6), 4)]
    assert reference.compute_reference("py", model, first) == {
        "r0": {"tokens": [3], "top2_gap": [0.5]},
        "r1": {"tokens": [2], "top2_gap": [0.5]},
    }
    # Same tokens under other rids (another trial's numbering), and one new prompt.
    again = [Req("a", (1, 2, 3), 4), Req("b", (5, 6), 4), Req("c", (7,), 4)]
    got = reference.compute_reference("py", model, again)
    assert computed == [["r0", "r1"], ["c"]]
    assert got["a"] == {"tokens": [3], "top2_gap": [0.5]} and got["c"]["tokens"] == [1]


def test_other_tokens_interpreter_or_weights_are_a_miss(computed, tmp_path):
    model = _model(tmp_path)
    reference.compute_reference("py", model, [Req("r0", (1, 2), 4)])
    reference.compute_reference("py", model, [Req("r0", (1, 2), 5)])  # more new tokens
    reference.compute_reference("other-py", model, [Req("r0", (1, 2), 4)])
    (model / "model.safetensors").write_bytes(b"new weights")
    reference.compute_reference("py", model, [Req("r0", (1, 2), 4)])
    assert computed == [["r0"], ["r0"], ["r0"], ["r0"]]


@pytest.mark.process  # the release's interpreter computes, for real
def test_a_kept_worker_answers_batch_after_batch_as_the_one_shot_task(tmp_path, monkeypatch):
    """A warm pool's worker loads the model once; its answers equal the one-shot task's, and
    closing it reaps its process."""
    from hicache_diag.engines.sglang.model import default_model_dir
    from hicache_diag.engines.sglang.release import probe_sglang

    install = probe_sglang()
    model = default_model_dir(install.python, install.transformers)
    monkeypatch.setenv("HICACHE_DIAG_CACHE", str(tmp_path / "cache"))  # nothing cached
    first, second = [Req("a", (5, 9, 17), 3)], [Req("b", (7, 8), 2), Req("c", (1, 2, 3, 4), 2)]
    worker = reference.ReferenceWorker()
    try:
        got_a = reference.compute_reference(install.python, model, first, worker)
        pid = worker.proc.pid
        got_bc = reference.compute_reference(install.python, model, second, worker)
        assert worker.proc.pid == pid  # one process for both batches
    finally:
        worker.close()
    assert worker.proc is None
    assert {**got_a, **got_bc} == reference._compute(install.python, model, first + second)
    assert [len(got_bc[r]["tokens"]) for r in ("b", "c")] == [2, 2]
