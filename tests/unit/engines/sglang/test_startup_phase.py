"""The start-up phase read from SGLang's server log, for the status line during the wait."""

from __future__ import annotations

import pytest

from hicache_diag.engines.sglang.startup_log import startup_phase

LOG = [
    ("", "launching"),
    ("[2026-12-01 10:00:00] server_args=ServerArgs(model_path=...)\n", "launching"),
    (
        "[PP0 TP0] Init torch distributed begin.\n[PP0 TP0] Load weight begin. avail mem=20 GB\n",
        "loading the model",
    ),
    (
        "[PP1 TP0] Load weight end. type=LlamaForCausalLM\n[PP1 TP0] Memory pool end. avail mem\n",
        "allocating the KV cache",
    ),
    (
        "... Load weight end ...\nINFO:     Uvicorn running on http://127.0.0.1:30000\n",
        "waiting for /health_generate",
    ),
]


@pytest.mark.parametrize(("tail", "phase"), LOG)
def test_phase_from_the_log(tail, phase):
    assert startup_phase(tail) == phase


def test_ready_timeout_env_raises_the_wait_on_a_loaded_box(monkeypatch):
    from hicache_diag.engines.sglang.server import (
        READY_TIMEOUT_ENV,
        READY_TIMEOUT_S,
        ready_timeout_s,
    )

    monkeypatch.delenv(READY_TIMEOUT_ENV, raising=False)
    assert ready_timeout_s() == READY_TIMEOUT_S
    monkeypatch.setenv(READY_TIMEOUT_ENV, "900")
    assert ready_timeout_s() == 900.0
    for bad in ("", "soon", "0", "-5", "nan", "inf"):
        monkeypatch.setenv(READY_TIMEOUT_ENV, bad)
        assert ready_timeout_s() == READY_TIMEOUT_S, bad
