"""Two real rank processes on gloo: backup through the real files, then prefetch with the real
l3-partial-hit fault on rank 1. Legacy switches keep the divergence; l3-hit/l3-progress=min
remove it, each MIN on its own group from its own thread, on the runtime's real ParallelState;
then the control queues drain by PP0's counts relayed with the real pp_sync."""

from __future__ import annotations

import multiprocessing as mp
import threading

import psutil
import pytest
import torch

TOKENS = list(range(40, 50))  # 5 pages of 2
PAGE = 2


def _recording_state(pp_rank: int, hooks):
    """The runtime's real ParallelState (gloo groups, pp_sync, thread groups), recording which
    thread calls which thread group."""
    from hicache_diag.engines.builtin.runtime.distributed.parallel_state import ParallelState

    class Recording(ParallelState):
        def all_reduce_thread_group(self, name, tensor, op="min"):
            self.calls.append((threading.current_thread().name, name))
            super().all_reduce_thread_group(name, tensor, op)

    state = Recording(pp_rank, 2, 0, 1, hooks)
    state.calls = []
    return state


def _prefetch_once(rank: int, comm, hooks, l3_dir: str, preset: str) -> dict:
    from hicache_diag.engines.builtin.runtime.managers.storage_controller import StorageController
    from hicache_diag.engines.builtin.runtime.mem_cache.hicache_storage import (
        HiCacheFile,
        HiCacheStorageConfig,
    )
    from hicache_diag.engines.builtin.runtime.mem_cache.memory_pool_host import HostKVCache
    from hicache_diag.engines.builtin.runtime.protocol import build_protocol
    from hicache_diag.engines.builtin.runtime.server_args import ServerArgs

    cfg = HiCacheStorageConfig(pp_rank=rank, pp_size=2, model_name="tiny")
    pool = HostKVCache(size=32, page_size=PAGE, layer_num=2, head_num=2, head_dim=2)
    policy = ServerArgs().hicache_storage_prefetch_policy
    ctrl = StorageController(
        HiCacheFile(cfg, l3_dir, hooks), pool, PAGE, comm, build_protocol(preset), policy
    )
    ctrl.start()
    try:
        slots = pool.alloc(len(TOKENS))
        pool.k_buffer[:, slots] = rank + 1.0
        ctrl.write_storage(slots, TOKENS)
        ctrl.drain_queue("ack_backup_queue", 1, timeout=30)
        ctrl.prefetch("r", TOKENS)
        (op,) = ctrl.drain_queue("prefetch_hit_queue", 1, timeout=30)
        assert ctrl.submit_prefetch_io(op)
        acks = ctrl.consume_prefetch_acks(2, timeout=30)  # one batch, then completion
        loaded = pool.k_buffer[:, op.host_indices[: op.completed_tokens]]
        ctrl.append_host_mem_release(op.host_indices)
        counts = ctrl.drain_storage_control_queues(timeout=30)
        comm.drain_async_work()
        return {
            "released": len(counts["host_mem_release_queue"]),
            "hit_local": op.storage_hit_count_local,
            "hit": op.storage_hit_count,
            "progress": [a.completed_tokens for a in acks],
            "data_ok": bool((loaded == rank + 1.0).all()),
            "faults": len(ctrl.drain_storage_faults()),
        }
    finally:
        assert ctrl.stop() == []


def _rank_main(rank: int, store_path: str, l3_dir: str, out) -> None:
    import torch.distributed as dist

    from hicache_diag.faults.hooks import Hooks
    from hicache_diag.faults.install import install_faults

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, 2), rank=rank, world_size=2)
    try:
        hooks = Hooks(rank=rank, pp_rank=rank)
        comm = _recording_state(rank, hooks)
        install_faults(
            hooks, ["l3-partial-hit:rank=1,keep=0.4"], seed=0, rank=rank, pp_rank=rank, tp_rank=0
        )
        result = {p: _prefetch_once(rank, comm, hooks, l3_dir, p) for p in ("legacy", "full")}
        result["calls"] = sorted(set(comm.calls))
        result["fired"] = len(hooks.drain_fired())
        out.put((rank, result))
    finally:
        dist.destroy_process_group()


@pytest.fixture
def two_ranks(tmp_path):
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    args = (str(tmp_path / "store"), str(tmp_path / "l3"), out)
    procs = [ctx.Process(target=_rank_main, args=(r, *args)) for r in (0, 1)]
    for p in procs:
        p.start()
    try:
        results = dict(out.get(timeout=120) for _ in procs)
        for p in procs:
            p.join(30)
        yield results, procs
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
        left = [p.pid for p in procs if psutil.pid_exists(p.pid)]
        assert left == [], f"rank processes left behind: {left}"


@pytest.mark.process
def test_l3_switches_on_real_gloo_ranks(two_ranks):
    results, procs = two_ranks
    assert [p.exitcode for p in procs] == [0, 0]
    r0, r1 = results[0], results[1]
    # legacy: each rank keeps what its own storage said (keep=0.4 of 5 pages -> 2 on rank 1)
    assert (r0["legacy"]["hit_local"], r1["legacy"]["hit_local"]) == (10, 4)
    assert (r0["legacy"]["hit"], r1["legacy"]["hit"]) == (10, 4)
    assert (r0["legacy"]["progress"][0], r1["legacy"]["progress"][0]) == (10, 4)
    # full: both agree on rank 1's shorter prefix, and read exactly that much
    assert (r0["full"]["hit_local"], r1["full"]["hit_local"]) == (10, 4)
    assert r0["full"]["hit"] == r1["full"]["hit"] == 4
    assert r0["full"]["progress"][0] == r1["full"]["progress"][0] == 4
    assert (r0["fired"], r1["fired"]) == (0, 2)  # the fault hit rank 1 only, once per query
    for r in (r0, r1):
        assert r["legacy"]["data_ok"] and r["full"]["data_ok"]
        assert r["full"]["faults"] == 0
        assert r["full"]["released"] == 2  # PP0's count of released pages, relayed to PP1
        assert r["calls"] == [
            ("hicache-prefetch", "prefetch_hits"),
            ("hicache-prefetch-sync", "prefetch_completion"),
        ]
