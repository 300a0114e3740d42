"""A write-through backup decided on one rank alone, SGLang 0.5.23.

Exported from a hicache-diag run (sglang-0.5.23-form-c-tp): at step 46 rank 1 (TP1) skipped a write-through backup of 1 tokens (`host_shortages` {'evict_calls': 1, 'evicted': 0, 'free': 0, 'need': 1}), rank 0 (TP0) backed up 1 tokens.

The backup is decided on each rank alone (`_execute_kv_backup` returns None when the host pool
is short and `evict_host` cannot free enough) and no peer is told; the ranks then agree only on
how many acks to drain: under PP, PP0 counts its own queue and relays the count (`_pp_sync`),
under TP the counts are MIN-reduced. So either a rank drains an ack it never enqueued (a PP
follower short: `IndexError`) or a rank keeps an ack, and its node locked, that its peers never
had (PP0 short, or a TP rank short).

This test runs the two ranks as two processes joined by real gloo groups (SGLang's own
`init_distributed_environment` / `initialize_model_parallel`), each with a real
`UnifiedRadixCache` built by its constructor from `CacheInitParams` carrying those groups (a
real tree core and device KV pool on the CPU). A scheduler round on both ranks: one
`check_hicache_events` (the round's event poll), then the same insert and the same `BackupKV`
(`tree_core.build_backup_kv_action`, what a write-through insert emits) through
`_apply_cache_action`; then both run the next round's `check_hicache_events`, whose collectives
(`_all_reduce`, `_pp_sync`, `_all_reduce_attn_groups`) are the release's own over the real groups. Only the
HiCache controller (the DMA engine) is a stand-in: `write` takes host slots from a host pool of
a given room and returns None when the room is short, `start_writing` turns pending writes into
one finished ack. The per-rank quantity is that room: the short rank's host pool is one slot
short of the backup, and nothing on its host is evictable.

Invariant: after an ack round every rank holds the same write-through state: the same nodes
still being backed up, the same nodes backed up to host, the same host slots taken and the same
device tokens locked. A release without this code path skips.

Run: python -m pytest -q test_write_through_rank_symmetry.py   (plain pytest, against the installed SGLang)
"""

import multiprocessing
import os
import tempfile
import time
import traceback
import unittest
from array import array
from types import SimpleNamespace

import torch

try:
    from sglang.srt.distributed import parallel_state
    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
    from sglang.srt.runtime_context import get_parallel
except ImportError as exc:  # a release without the unified radix cache
    UnifiedRadixCache = None
    _MISSING = f"{type(exc).__name__}: {exc}"

try:  # the test's own scaffolding (SGLang 0.5.23's test helper), apart from the code path
    from sglang.test.test_utils import publish_build_topology
except ImportError:
    publish_build_topology = None
_NO_SCAFFOLD = ("this test builds its ranks' process groups with "
                "sglang.test.test_utils.publish_build_topology (0.5.23's test helper), which "
                "this release lacks: not run here, which says nothing of the mechanism")

# From the run: the write one rank backed up (1 tokens, into 513 free host
# slots) while the short rank (tp rank 1) could not.
TOPOLOGY = "tp"  # "pp": two PP stages, TP 1; "tp": two TP ranks, PP 1
SHORT_RANK = 1
KV_TOKENS = 1
ROOMY_HOST_FREE = 513
SHORT_HOST_FREE = KV_TOKENS - 1  # one slot short: the smallest real shortage
DEVICE_TOKENS = max(1024, 2 * KV_TOKENS)

# The UnifiedRadixCache methods this test drives (a release without one of them skips).
_PATH = ("_apply_cache_action", "_execute_and_commit_kv_backup", "_execute_kv_backup",
         "evict_host", "check_hicache_events", "writing_check")
_TIMEOUT_S = 240


class _Ready:
    def query(self):
        return True

    def synchronize(self):
        pass


class _HostPool:
    """The host KV pool's room: the one per-rank physical quantity here."""

    def __init__(self, free):
        self.free = free
        self.anchor_entry = SimpleNamespace(
            host_pool=SimpleNamespace(shared_allocation_domain=None), host_evict_fn=None
        )

    def available_size(self):
        return self.free


class _Controller:
    """HiCacheController's write/ack surface: `write` allocates host slots (None when short),
    `start_writing` turns the pending writes into one ack, as the real flush does."""

    def __init__(self, host_free):
        self.mem_pool_host = _HostPool(host_free)
        self.ack_write_queue = []
        self.ack_load_queue = []
        self.enable_storage = False
        self._pending = []
        self._next = 0

    def write(self, device_indices, node_id=None, extra_pools=None, flush=True, **_):
        n = len(device_indices)
        if self.mem_pool_host.free < n:
            return None
        self.mem_pool_host.free -= n
        self._pending.append(node_id)
        self._next += n
        return torch.arange(self._next - n, self._next, dtype=torch.int64)

    def start_writing(self):
        if self._pending:
            ack = SimpleNamespace(node_ids=list(self._pending), finish_event=_Ready(),
                                  start_event=_Ready(), num_tokens_by_pool={}, num_bytes=0,
                                  timing_enabled=False)
            self.ack_write_queue.append(ack)
            self._pending = []


def _cache(rank):
    """The release's UnifiedRadixCache, built by its constructor on this rank's real groups."""
    parallel = get_parallel()
    req_to_token = ReqToTokenPool(size=4, max_context_len=DEVICE_TOKENS, device="cpu",
                                  enable_memory_saver=False)
    kv = MHATokenToKVPool(size=DEVICE_TOKENS, page_size=1, dtype=torch.bfloat16, head_num=1,
                          head_dim=8, layer_num=2, device="cpu", enable_memory_saver=False)
    allocator = TokenToKVPoolAllocator(size=DEVICE_TOKENS, dtype=torch.bfloat16, device="cpu",
                                       kvcache=kv, need_sort=False)
    params = CacheInitParams(
        disable=False, req_to_token_pool=req_to_token, token_to_kv_pool_allocator=allocator,
        page_size=1, tree_components=(ComponentType.FULL,),
        tp_cache_group=parallel.tp_group.cpu_group,
        attn_tp_cache_group=parallel.attn_tp_group.cpu_group,
        attn_cp_cache_group=parallel.attn_cp_group.cpu_group,
        pp_cache_group=parallel.pp_group.cpu_group,
        pp_rank=parallel.pp_rank, pp_size=parallel.pp_size,
    )
    cache = UnifiedRadixCache(params=params)
    cache.cache_controller = _Controller(SHORT_HOST_FREE if rank == SHORT_RANK
                                         else ROOMY_HOST_FREE)
    return cache, allocator


def _state(cache, node, host_free):
    """What must agree across ranks: nodes still being backed up, nodes backed up to host,
    host slots taken, device tokens locked."""
    backed = [n for n in [node] if cache.tree_core.is_backuped(n)]
    used = host_free - cache.cache_controller.mem_pool_host.available_size()
    return (sorted(cache.ongoing_write_through), backed, used, cache.protected_size())


def _rank(rank, init_file, conn):
    """One rank's process: SGLang's process groups over gloo, the insert, one ack round."""
    try:
        sizes = {"pp_size": 2} if TOPOLOGY == "pp" else {"tp_size": 2}
        publish_build_topology(world_rank=rank, **sizes)
        parallel_state.init_distributed_environment(
            world_size=2, rank=rank, local_rank=rank, backend="gloo",
            distributed_init_method=f"file://{init_file}", timeout=120)
        parallel_state.initialize_model_parallel(backend="gloo")
        cache, allocator = _cache(rank)
        host_free = cache.cache_controller.mem_pool_host.available_size()
        # A scheduler round polls HiCache events (get_next_batch_to_run) before its
        # batch results insert: the round starts here, as on the server.
        cache.check_hicache_events()
        tokens = list(range(1, KV_TOKENS + 1))
        key = RadixKey(array("q", tokens))
        cache.insert(InsertParams(key=key, value=allocator.alloc(KV_TOKENS)))
        node = cache.match_prefix(MatchPrefixParams(key=key)).last_device_node
        # The same insert on every rank emits the same write-through backup.
        cache._apply_cache_action(cache.tree_core.build_backup_kv_action(node))
        decided = bool(cache.ongoing_write_through)
        cache.check_hicache_events()
        conn.send(("ok", decided, _state(cache, node, host_free)))
        torch.distributed.barrier()  # keep this rank's async sends alive until its peer is done
    except BaseException as exc:  # noqa: BLE001 - reported to the test process
        try:
            conn.send(("error", exc, traceback.format_exc()))
        except Exception:  # an exception that does not pickle
            conn.send(("error", RuntimeError(repr(exc)), traceback.format_exc()))


def _run_ranks(test):
    """Both ranks' results; a rank's exception is raised here as itself."""
    ctx = multiprocessing.get_context("fork")
    init_file = os.path.join(tempfile.mkdtemp(), "gloo-init")
    pipes = [ctx.Pipe(duplex=False) for _ in range(2)]
    procs = [ctx.Process(target=_rank, args=(r, init_file, pipes[r][1]), daemon=True)
             for r in range(2)]
    for p in procs:
        p.start()
    results = [None, None]
    deadline = time.monotonic() + _TIMEOUT_S
    try:
        # A rank that raises leaves its peer waiting in a collective: stop at the first error.
        while None in results and time.monotonic() < deadline:
            for r, (recv, _) in enumerate(pipes):
                if results[r] is None and recv.poll(0.1):
                    results[r] = recv.recv()
            if any(res and res[0] == "error" for res in results):
                break
    finally:
        for p in procs:
            p.join(1)
            if p.is_alive():
                p.kill()
    word = TOPOLOGY.upper()
    for r, result in enumerate(results):
        if result and result[0] == "error":
            exc, tb = result[1], result[2]
            if isinstance(exc, AttributeError):
                test.fail(f"{word}{r}: this release reads an attribute the test does not "
                          f"build ({exc}); update the test for it.\n{tb}")
            raise exc from RuntimeError(f"{word}{r} raised:\n{tb}")
    hung = [f"{word}{r}" for r, res in enumerate(results) if res is None]
    if hung:
        test.fail(f"{', '.join(hung)} sent nothing in {_TIMEOUT_S} s (hung in a collective?)")
    return results


@unittest.skipIf(UnifiedRadixCache is None,
                 f"this SGLang lacks what the test imports: {globals().get('_MISSING')}")
class TestWriteThroughRankSymmetry(unittest.TestCase):
    def setUp(self):
        missing = [name for name in _PATH if not hasattr(UnifiedRadixCache, name)]
        if missing:
            self.skipTest(f"this test drives UnifiedRadixCache.{', '.join(missing)}, which "
                          "this release lacks")
        if publish_build_topology is None:
            self.skipTest(_NO_SCAFFOLD)

    def test_one_rank_short_of_host_memory_keeps_write_through_state_equal(self):
        results = _run_ranks(self)
        word = TOPOLOGY.upper()
        states = [res[2] for res in results]
        self.assertEqual(
            states[0], states[1],
            "(being backed up, backed up to host, host slots taken, device tokens locked): "
            f"{word}0 {states[0]}, {word}1 {states[1]}",
        )


if __name__ == "__main__":
    unittest.main()
