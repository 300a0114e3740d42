"""A warm SGLang server with the L3 file backend (issue 31) on REAL SGLang 0.5.23, PP2 + HiCache
L3 on CPU, with HiCacheFile's metadata cache on (SGLang's own switch) so its in-memory index is
really filled: the first trial leaves pages in the pool's L3 dir and keys in that index; the
second runs on the same server after the harness emptied the dir and SGLang's own
/hicache/storage-backend/clear emptied the index, every rank's L3 proof passed. Then a boundary
that empties the dir but skips SGLang's clear leaves the keys in the index: the proof fails on
them and the server is restarted, with a new L3 dir. No SGLang process is left behind."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest

from hicache_diag.trials.rundir import read_manifest
from tests.e2e.test_sglang_engine import _missing

pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(_missing), reason=_missing or "")]


def _cfg(out: Path):
    from hicache_diag.engines.registry import build
    from hicache_diag.engines.sglang.options import SglangOptions

    return build(
        SglangOptions(
            requests=6,
            max_new_tokens=4,
            hang_timeout=120.0,
            out=str(out),
            hicache_storage_backend="file",
            sglang_env=("SGLANG_HICACHE_FILE_BACKEND_ENABLE_METADATA_CACHE=1",),
        )
    )


def _files(path: Path) -> int:
    return len(list(path.iterdir()))


def test_warm_server_with_l3_is_reused_when_proven_empty_and_restarted_when_not(
    tmp_path, monkeypatch
):
    from hicache_diag.engines.sglang import clean_proof, warm
    from hicache_diag.engines.sglang.warm import WarmSglang

    ready = os.environ.get("HICACHE_DIAG_SGLANG_READY_TIMEOUT", "900")  # a busy box is slow
    monkeypatch.setenv("HICACHE_DIAG_SGLANG_READY_TIMEOUT", ready)
    cfg = _cfg(tmp_path)
    pool = WarmSglang(tmp_path / "warm-server")
    dirs = [tmp_path / f"trial{j}" for j in range(3)]
    pids = []
    try:
        first = pool.trial(cfg.for_trial(0, str(dirs[0])))
        assert first.verdict.outcome.value == "ok", first.verdict.evidence
        pids.append(pool.server.popen.pid)
        l3 = pool.storage_dir
        assert l3 == tmp_path / "warm-server" / "l3-0"
        assert read_manifest(dirs[0]).config["spec"]["hicache_storage_dir"] == str(l3)
        left = _files(l3)
        assert left > 0  # the trial's pages: the next boundary must empty them

        second = pool.trial(cfg.for_trial(1, str(dirs[1])))
        assert second.verdict.outcome.value == "ok", second.verdict.evidence
        record = read_manifest(dirs[1]).warm_server
        assert record.reused and not record.differences, record.differences
        assert record.server_pid == pids[0] and record.proof == record.fresh
        for rank in ("0", "1"):
            facts = record.proof[rank]
            assert facts["storage_backend"] == "HiCacheFile", facts
            assert facts["l3_files"] == facts["l3_metadata_keys"] == 0, facts
            assert facts["l3_existence_beliefs"] == 0 and facts["storage_threads_alive"] > 0
        keys_after = _files(l3)
        assert keys_after > 0  # the second trial wrote its own pages again

        def empty_dir_only(url: str, storage_dir: Path) -> list[str]:
            for entry in storage_dir.iterdir():  # SGLang's clear skipped: its index stays
                entry.unlink()
            return []

        monkeypatch.setattr(warm, "clear_storage", empty_dir_only)
        third = pool.trial(cfg.for_trial(2, str(dirs[2])))
        monkeypatch.setattr(warm, "clear_storage", clean_proof.clear_storage)
        record = read_manifest(dirs[2]).warm_server
        assert not record.reused and record.why == "restarted: not clean"
        text = "\n".join(record.differences)
        assert "rank0: l3_metadata_keys" in text and "rank1: l3_metadata_keys" in text, text
        assert "l3_files" not in text, text
        assert third.verdict.outcome.value == "ok", third.verdict.evidence
        pids.append(pool.server.popen.pid)
        assert pids[1] != pids[0] and not psutil.pid_exists(pids[0])
        assert pool.storage_dir == tmp_path / "warm-server" / "l3-1"
        print(f"L3 entries after trial 0: {left}, after trial 1: {keys_after}")
        print(f"boundary of the reused trial: {read_manifest(dirs[1]).warm_server.boundary_s} s")
    finally:
        pool.close()
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
