"""A warm server with the L3 file backend, without SGLang: the L3 facts a rank reads off a
HiCacheFile-shaped backend over a real dir (its files, its metadata cache, its evictor, the
tree's existence beliefs), the comparison with the fresh server's, which launches may be
reused at all, and the boundary through a stand-in HTTP server and a rank thread on real
files: a file left in the pool's L3 dir is emptied by the harness and the server reused; a key
left in an index SGLang's clear did not clear makes the proof fail and the server restart."""

from __future__ import annotations

import threading
from collections import OrderedDict
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest

from hicache_diag import evidence as ev
from hicache_diag.engines.sglang.clean_proof import (
    Control,
    clear_storage,
    differences,
    storage_refusal,
)
from hicache_diag.engines.sglang.plugin.clean_state import read_facts
from hicache_diag.engines.sglang.plugin.l3_state import storage_facts
from hicache_diag.engines.sglang.plugin.recorder import StepRecorder
from hicache_diag.faults.hooks import Hooks
from tests.unit.engines.sglang.test_warm_proof import _rank_thread, _scheduler


class HiCacheFile:  # SGLang's name is what the plugin recognises
    def __init__(self, path: Path, metadata: bool = False) -> None:
        self.file_path = str(path)
        self.metadata_cache = SimpleNamespace(cache={}) if metadata else None
        self._evictor = SimpleNamespace(_lru=OrderedDict(), _pending_writes=set(), _total_bytes=0)


class _Thread:
    def is_alive(self) -> bool:
        return True


def _l3_scheduler(path: Path, backend=None, beliefs=None):
    scheduler = _scheduler()
    cc = scheduler.tree_cache.cache_controller
    cc.storage_backend = backend or HiCacheFile(path)
    cc.prefetch_tokens_occupied = 0
    cc.prefetch_thread = cc.backup_thread = _Thread()
    cc.prefetch_queue, cc.backup_queue = [], []
    scheduler.tree_cache.prefetch_loaded_tokens_by_reqid = {}
    if beliefs is not None:
        scheduler.tree_cache.storage_existence_cache = beliefs
    return scheduler


def test_an_empty_file_backend_reads_all_zero(tmp_path):
    facts = read_facts(_l3_scheduler(tmp_path))
    assert facts["storage_backend"] == "HiCacheFile" and facts["storage_threads_alive"] == 2
    for key in ("l3_files", "l3_metadata_keys", "l3_evictor_keys", "l3_evictor_bytes"):
        assert facts[key] == 0, key
    assert facts["prefetch_tokens_occupied"] == 0 and facts["prefetch_queue"] == 0
    assert differences({0: facts}, {0: facts}) == []


@pytest.mark.parametrize(
    ("dirty", "expected"),
    [
        ("file", "rank0: l3_files 1 (fresh server: 0)"),
        ("metadata", "rank0: l3_metadata_keys 1 (fresh server: 0)"),
        ("evictor", "rank0: l3_evictor_keys 1 (fresh server: 0)"),
        ("occupied", "rank0: prefetch_tokens_occupied 64 (fresh server: 0)"),
    ],
)
def test_anything_left_in_l3_is_a_difference(tmp_path, dirty, expected):
    fresh = {0: read_facts(_l3_scheduler(tmp_path, HiCacheFile(tmp_path, metadata=True)))}
    backend = HiCacheFile(tmp_path, metadata=True)
    scheduler = _l3_scheduler(tmp_path, backend)
    if dirty == "file":
        (tmp_path / "k_model_0_1_2_0.bin").write_bytes(b"kv")
    elif dirty == "metadata":
        backend.metadata_cache.cache["k_model_0_1_2_0"] = 1.0
    elif dirty == "evictor":
        backend._evictor._lru["k"] = 2
    else:
        scheduler.tree_cache.cache_controller.prefetch_tokens_occupied = 64
    assert expected in differences({0: read_facts(scheduler)}, fresh)


def test_existence_beliefs_of_both_shapes_are_counted(tmp_path):
    class Old:  # 0.5.19: one LRU with __len__
        def __len__(self) -> int:
            return 3

    pool = SimpleNamespace(_entries={"a": None}, _inflight={"b": 1})
    new = SimpleNamespace(_pools={"kv": pool})  # later 0.5.2x: beliefs per pool
    assert read_facts(_l3_scheduler(tmp_path, beliefs=Old()))["l3_existence_beliefs"] == 3
    assert read_facts(_l3_scheduler(tmp_path, beliefs=new))["l3_existence_beliefs"] == 2
    assert "l3_existence_beliefs" not in read_facts(_l3_scheduler(tmp_path))  # 0.5.18: none


def test_another_backend_or_a_renamed_index_is_unknown_never_clean(tmp_path):
    other = type("HiCacheNixl", (), {})()
    facts = read_facts(_l3_scheduler(tmp_path, other))
    assert facts["storage_backend"] == ev.UNKNOWN
    assert "rank0: storage_backend unknown in this release: never assumed clean" in differences(
        {0: facts}, {0: facts}
    )
    renamed = HiCacheFile(tmp_path)
    del renamed._evictor
    facts = storage_facts(SimpleNamespace(), SimpleNamespace(storage_backend=renamed))
    assert facts["l3_evictor_keys"] == ev.UNKNOWN and facts["l3_files"] == 0
    renamed = HiCacheFile(tmp_path, metadata=True)
    del renamed._evictor._lru, renamed.metadata_cache.cache
    facts = storage_facts(SimpleNamespace(), SimpleNamespace(storage_backend=renamed))
    assert facts["l3_evictor_keys"] == facts["l3_metadata_keys"] == ev.UNKNOWN
    assert facts["l3_evictor_pending"] == 0


@pytest.mark.parametrize(
    ("backend", "storage_dir", "why"),
    [
        (None, None, ""),
        ("file", None, ""),
        ("file", "/data/l3", "a user's --hicache-storage-dir"),
        ("nixl", None, "the L3 backend 'nixl'"),
    ],
)
def test_only_the_file_backend_in_our_own_dir_may_be_reused(backend, storage_dir, why):
    spec = SimpleNamespace(hicache_storage_backend=backend, hicache_storage_dir=storage_dir)
    refusal = storage_refusal(spec)
    assert refusal.startswith(why) and bool(refusal) == bool(why)


class _Sglang(BaseHTTPRequestHandler):
    """Answers /flush_cache and the storage clear as SGLang does when idle; clears nothing
    itself (so an index left set stays set)."""

    paths: list[str] = []
    busy = False  # a request still running: SGLang refuses /flush_cache

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.paths.append(self.path)
        known = self.path in ("/flush_cache", "/hicache/storage-backend/clear")
        refused = self.busy and self.path == "/flush_cache"
        self.send_response(400 if refused else 200 if known else 404)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def sglang_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Sglang)
    _Sglang.paths, _Sglang.busy = [], False
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join(5)


def test_clear_storage_empties_the_dir_then_asks_sglang(tmp_path, sglang_url):
    (tmp_path / "a.bin").write_bytes(b"x")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.bin").write_bytes(b"y")
    assert clear_storage(sglang_url, tmp_path) == []
    assert list(tmp_path.iterdir()) == []
    assert _Sglang.paths == ["/hicache/storage-backend/clear"]
    gone = clear_storage(sglang_url + "/nowhere", tmp_path / "missing")
    assert "could not be emptied" in gone[0] and "refused: HTTP 404" in gone[1]


def _l3_cfg():
    spec = SimpleNamespace(hicache_storage_backend="file", hicache_storage_dir=None)
    return SimpleNamespace(
        python="p",
        sglang_version="v",
        spec=spec,
        cpu_kernel_names={},
        faults=(),
        world_size=1,
        release={},  # unpatched: the warm key's patch sha is None
    )


@contextmanager
def _pool_with_a_rank(tmp_path, url):
    """A warm pool whose server is the stand-in at `url` and whose one rank answers from a
    thread; yields (pool, cfg, backend)."""
    from hicache_diag.engines.sglang.warm import WarmSglang

    pool, cfg = WarmSglang(tmp_path / "warm"), _l3_cfg()
    server = SimpleNamespace(url=url, alive=lambda: True, popen=None, close=lambda: 0.0)
    pool.adopt(server, cfg)
    pool.control = Control(pool.control_dir, world_size=1)
    backend = HiCacheFile(pool.storage_dir, metadata=True)
    first, stop = tmp_path / "trial0", threading.Event()
    first.mkdir()
    recorder = StepRecorder(str(ev.rank_jsonl(first, 0)), 0, 0, 0, Hooks(rank=0))
    thread = _rank_thread(
        pool.control.dir, _l3_scheduler(pool.storage_dir, backend), recorder, stop
    )
    try:
        pool.take_fresh_proof(first)
        yield pool, cfg, backend
    finally:
        stop.set()
        thread.join(5)
        recorder.close()


@pytest.mark.parametrize("leftover", ["file", "index"])
def test_the_boundary_empties_our_l3_dir_and_restarts_on_an_index_left_set(
    tmp_path, sglang_url, leftover
):
    with _pool_with_a_rank(tmp_path, sglang_url) as (pool, cfg, backend):
        l3 = pool.storage_dir
        assert l3 == tmp_path / "warm" / "l3-0"
        assert pool.fresh_problems == [] and pool.fresh[0]["l3_files"] == 0
        (l3 / "k_model_0_1_2_0.bin").write_bytes(b"kv")  # the trial's page, always
        if leftover == "index":
            backend.metadata_cache.cache["k_model_0_1_2_0"] = 1.0
        record = pool.boundary(cfg, tmp_path / "trial1")
    assert list(l3.iterdir()) == []  # the harness emptied it either way
    # The fresh proof's clear and the boundary's; an index left set is looked at twice.
    looks = 1 if leftover == "file" else 2
    assert _Sglang.paths.count("/hicache/storage-backend/clear") == 1 + looks
    assert record.second_look is (looks == 2)
    if leftover == "file":
        assert record.reused and record.proof["0"]["l3_files"] == 0, record.differences
    else:
        assert not record.reused and record.why == "restarted: not clean"
        assert record.differences == ["rank0: l3_metadata_keys 1 (fresh server: 0)"]
        assert pool.server is None and pool.storage_dir is None


def test_a_refused_flush_leaves_l3_alone_and_restarts(tmp_path, sglang_url):
    with _pool_with_a_rank(tmp_path, sglang_url) as (pool, cfg, _):
        (pool.storage_dir / "page.bin").write_bytes(b"kv")  # a running request's page
        _Sglang.busy, _Sglang.paths = True, []
        record = pool.boundary(cfg, tmp_path / "trial1")
    assert not record.reused and "/flush_cache refused: HTTP 400" in record.differences[0]
    assert _Sglang.paths == ["/flush_cache"]  # never emptied under a running request
    assert (tmp_path / "warm" / "l3-0" / "page.bin").exists() and pool.server is None


def test_one_count_reads_queues_lists_and_what_is_not_there():
    """The one count both halves of the proof read with (l3_state.count): a missing object is
    unknown unless the caller says it means none left."""
    from queue import Queue

    from hicache_diag.engines.sglang.plugin import clean_state, l3_state

    q = Queue()
    q.put(1)
    assert [l3_state.count(x) for x in (q, [1, 2], {"a": 1}, 3)] == [1, 2, 1, ev.UNKNOWN]
    assert l3_state.count(None) == ev.UNKNOWN and l3_state.count(None, none=0) == 0
    assert not hasattr(clean_state, "_count") and not hasattr(l3_state, "_size")
