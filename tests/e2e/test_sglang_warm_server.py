"""A warm SGLang server across trials (issue 31) on REAL SGLang 0.5.23, PP2 + HiCache L2 on CPU:
the second trial runs on the first one's server with every rank's clean-state proof passed and a
shorter start; a server left dirty (a request still running, so SGLang's own /flush_cache
refuses and the tree is not empty, and a session left open) is refused and restarted, and the
trial's manifest says why. No SGLang process is left behind."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from hicache_diag import evidence as ev
from hicache_diag.trials.rundir import read_manifest
from tests.e2e.test_sglang_engine import _missing

pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(_missing), reason=_missing or "")]


def _cfg(out: Path):
    from hicache_diag.engines.registry import build
    from hicache_diag.engines.sglang.options import SglangOptions

    return build(SglangOptions(requests=6, max_new_tokens=4, hang_timeout=120.0, out=str(out)))


def _post(url: str, path: str, body: dict) -> tuple[int, str]:
    req = urllib.request.Request(
        url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=600) as resp:
            return resp.status, resp.read().decode()
    except Exception as exc:  # noqa: BLE001 - the server is killed under it on purpose
        return 0, str(exc)


def _dirty(url: str, log: Path) -> threading.Thread:
    """A session left open, and a long request still running when the next trial begins
    (within the tiny model's 2048-token context)."""
    session = {"capacity_of_str_len": 4096, "session_id": "kept"}
    assert _post(url, "/open_session", session)[0] == 200
    size = log.stat().st_size
    body = {
        "rid": "long",
        "input_ids": list(range(1, 41)),
        "sampling_params": {"max_new_tokens": 1900, "temperature": 0.0, "ignore_eos": True},
    }
    thread = threading.Thread(target=_post, args=(url, "/generate", body), daemon=True)
    thread.start()
    deadline = time.time() + 300
    while time.time() < deadline:  # running: SGLang logged its prefill and a decode batch
        text = log.read_bytes()[size:].decode(errors="replace")
        if "Decode batch" in text:
            return thread
        time.sleep(0.5)
    raise AssertionError("the long request never started decoding")


def _startup(run_dir: Path) -> float:
    return ev.read_record(ev.LauncherRecord, run_dir / ev.LAUNCHER).timings["startup_s"]


def test_warm_server_reuses_a_clean_server_and_restarts_a_dirty_one(tmp_path, monkeypatch):
    from hicache_diag.engines.sglang.warm import WarmSglang

    monkeypatch.setenv("HICACHE_DIAG_SGLANG_READY_TIMEOUT", "900")
    cfg = _cfg(tmp_path)
    pool = WarmSglang(tmp_path / "warm-server")
    dirs = [tmp_path / f"trial{j}" for j in range(3)]
    pids = []
    try:
        first = pool.trial(cfg.for_trial(0, str(dirs[0])))
        assert first.verdict.outcome.value == "ok", first.verdict.evidence
        pids.append(pool.server.popen.pid)
        second = pool.trial(cfg.for_trial(1, str(dirs[1])))
        assert second.verdict.outcome.value == "ok", second.verdict.evidence
        warm = read_manifest(dirs[1]).warm_server
        assert warm.reused and not warm.differences, warm.differences
        assert warm.server_pid == pids[0] and warm.server_trial == 1
        assert warm.proof == warm.fresh and set(warm.proof) == {"0", "1"}
        assert warm.proof["0"]["tree_values"] == 0 and warm.proof["1"]["sessions"] == 0
        assert _startup(dirs[1]) < _startup(dirs[0]) / 2
        for rank in (0, 1):  # each trial's steps in its own run dir
            assert ev.rank_jsonl(dirs[1], rank).stat().st_size > 0
            assert ev.clean_state_json(dirs[1], rank).is_file()
        assert "Prefill batch" in (dirs[1] / ev.SERVER_LOG).read_text()

        long = _dirty(pool.server.url, pool.log_path)
        third = pool.trial(cfg.for_trial(2, str(dirs[2])))
        long.join(60)
        warm = read_manifest(dirs[2]).warm_server
        assert not warm.reused and warm.why == "restarted: not clean"
        text = "\n".join(warm.differences)
        assert "/flush_cache refused" in text and "sessions 1" in text, text
        assert "running_reqs 1" in text, text
        assert third.verdict.outcome.value == "ok", third.verdict.evidence
        pids.append(pool.server.popen.pid)
        assert pids[1] != pids[0] and not psutil.pid_exists(pids[0])
        assert _startup(dirs[2]) > 5 * (read_manifest(dirs[1]).warm_server.boundary_s or 0)
    finally:
        pool.close()
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
