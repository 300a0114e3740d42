"""Real gloo between real processes: pyobj and tensor-dict transport, pp_sync relay, groups."""

from __future__ import annotations

import multiprocessing as mp
import socket
import traceback

import pytest
import torch

from hicache_diag.runtime.distributed.parallel_state import HIRADIX_PP_SYNC


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, pp: int, tp: int, port: int, q) -> None:
    try:
        import os

        import torch.distributed as dist

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        from hicache_diag.runtime.distributed.parallel_state import (
            ParallelState,
            init_distributed,
        )
        from hicache_diag.runtime.hooks import Hooks

        init_distributed(rank, world, None, timeout_s=30)
        p, t = divmod(rank, tp)
        ps = ParallelState(p, pp, t, tp, Hooks(rank, p, t))
        q.put((rank, _exercise(ps)))
        dist.barrier()
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - report to the parent
        q.put((rank, traceback.format_exc()))


def _exercise(ps) -> dict:
    out = {}
    if ps.is_first_rank:
        works = ps.send_pyobj_to_next({"reqs": [1, 2, 3], "rank": ps.rank})
        # The sender decides the size; the receiver allocates what the metadata says.
        works += ps.send_dict_to_next({"hidden_states": torch.arange(12.0).view(3, 4)}, "proxy")
        for w in works:
            w.wait()
    else:
        out["pyobj"] = ps.recv_pyobj_from_prev()
        out["shape"] = tuple(ps.recv_dict_from_prev("proxy")["hidden_states"].shape)
    t = torch.tensor([7 if ps.is_first_rank else -1])
    ps.pp_sync(t)
    out["sync"] = int(t.item())
    out["inflight"] = ps.inflight_sends()
    ps.drain_async_work()
    m = torch.tensor([ps.rank + 10])
    ps.all_reduce_pp(m, "min")
    out["min_all"] = int(m.item())
    tp_sum = torch.tensor([1])
    ps.all_reduce_tp(tp_sum, "sum")
    out["tp_sum"] = int(tp_sum.item())
    g = torch.tensor([ps.rank])
    ps.all_reduce_thread_group("prefetch_hits", g, "max")
    out["thread_max"] = int(g.item())
    return out


def _run(pp: int, tp: int) -> dict[int, dict]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    world, port = pp * tp, _free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, pp, tp, port, q)) for r in range(world)]
    for p in procs:
        p.start()
    results = dict(q.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    for r, res in results.items():
        assert isinstance(res, dict), f"rank {r} failed:\n{res}"
    return results


def test_tag_is_sglangs():
    assert HIRADIX_PP_SYNC == 0x50704869


@pytest.mark.usefixtures("no_leftover_processes")
def test_pp2_tp2_transport_and_collectives():
    res = _run(pp=2, tp=2)
    for r in (2, 3):  # PP1: each TP rank hears from its own TP column on PP0
        assert res[r]["pyobj"] == {"reqs": [1, 2, 3], "rank": r - 2}
        assert res[r]["shape"] == (3, 4)
    assert all(res[r]["sync"] == 7 for r in range(4)), "pp_sync must relay PP0's value"
    assert res[0]["inflight"] == 1 and res[2]["inflight"] == 0, "only non-last stages keep sends"
    assert {res[r]["min_all"] for r in range(4)} == {10}
    assert {res[r]["tp_sum"] for r in range(4)} == {2}
    assert {res[r]["thread_max"] for r in range(4)} == {3}
