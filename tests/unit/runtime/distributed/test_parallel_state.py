"""Real gloo between real processes: pyobj and tensor-dict transport, pp_sync relay, groups."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import torch

from hicache_diag.runtime.distributed.parallel_state import HIRADIX_PP_SYNC


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


WORKER = """
import json, os, sys
import torch.distributed as dist
from hicache_diag.runtime.distributed.parallel_state import ParallelState, init_distributed
from hicache_diag.runtime.hooks import Hooks
import importlib.util
spec = importlib.util.spec_from_file_location("ps_test", sys.argv[5])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
_exercise = mod._exercise
rank, world, pp, tp = (int(a) for a in sys.argv[1:5])
init_distributed(rank, world, None, timeout_s=60)
p, t = divmod(rank, tp)
out = _exercise(ParallelState(p, pp, t, tp, Hooks(rank, p, t)))
dist.barrier()
dist.destroy_process_group()
print(json.dumps(out))
"""


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
    """Plain subprocesses (not multiprocessing: its resource tracker would outlive the test)."""
    world, port = pp * tp, _free_port()
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "OMP_NUM_THREADS": "1",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(r), str(world), str(pp), str(tp), __file__],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for r in range(world)
    ]
    results = {}
    try:
        for r, p in enumerate(procs):
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, f"rank {r} failed:\n{err[-3000:]}"
            results[r] = json.loads(out.strip().splitlines()[-1])
    finally:
        for p in procs:
            p.kill()
            p.wait()
    return results


def test_tag_is_sglangs():
    assert HIRADIX_PP_SYNC == 0x50704869


@pytest.mark.usefixtures("no_leftover_processes")
def test_pp2_tp2_transport_and_collectives():
    res = _run(pp=2, tp=2)
    for r in (2, 3):  # PP1: each TP rank hears from its own TP column on PP0
        assert res[r]["pyobj"] == {"reqs": [1, 2, 3], "rank": r - 2}
        assert res[r]["shape"] == [3, 4]
    assert all(res[r]["sync"] == 7 for r in range(4)), "pp_sync must relay PP0's value"
    assert res[0]["inflight"] == 1 and res[2]["inflight"] == 0, "only non-last stages keep sends"
    assert {res[r]["min_all"] for r in range(4)} == {10}
    assert {res[r]["tp_sum"] for r in range(4)} == {2}
    assert {res[r]["thread_max"] for r in range(4)} == {3}
