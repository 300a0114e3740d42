"""Real gloo between real processes: pyobj and tensor-dict transport, pp_sync relay, groups, and
the TP device/cpu split that turns a skipped HiCache collective into a hang (#28429)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import torch

from hicache_diag.engines.builtin.runtime.distributed.parallel_state import (
    DEVICE_BACKENDS,
    HIRADIX_PP_SYNC,
    GroupCoordinator,
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


WORKER = """
import json, os, sys
import torch.distributed as dist
from hicache_diag.engines.builtin.runtime.distributed.parallel_state import (
    ParallelState, init_distributed)
from hicache_diag.faults.hooks import Hooks
import importlib.util
spec = importlib.util.spec_from_file_location("ps_test", sys.argv[5])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
exercise = getattr(mod, sys.argv[6])
rank, world, pp, tp = (int(a) for a in sys.argv[1:5])
init_distributed(rank, world, None, timeout_s=60)
p, t = divmod(rank, tp)
out = exercise(ParallelState(p, pp, t, tp, Hooks(rank, p, t)))
if out.pop("hung", False):  # a blocked collective cannot be cancelled: leave without teardown
    print(json.dumps(out), flush=True)
    os._exit(0)
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
    out.update(_exercise_tp_groups(ps))
    return out


def _exercise_tp_groups(ps) -> dict:
    tp = ps.tp_group
    model = ps.tp_all_reduce_sum(torch.tensor([float(ps.tp_rank + 1)]))
    vote = torch.tensor([ps.rank + 20])
    work = ps.all_reduce_pp_async(vote, "min")
    work.wait()
    return {
        "tp_ranks": list(tp.ranks),
        "rank_in_group": tp.rank_in_group,
        "distinct_groups": tp.device_group is not tp.cpu_group,
        "model_sum": float(model.item()),
        "async_min": int(vote.item()),
    }


def _skip_hicache_collective(ps) -> dict:
    """#28429 at the group level: TP0 enters the HiCache count MIN (cpu group), TP1 skipped it and
    is already in the model's all-reduce (device group). Neither can complete."""
    import threading

    errors: list[str] = []

    def target():
        try:
            if ps.tp_rank == 0:
                ps.all_reduce_tp(torch.tensor([3, 1]), "min")
            else:
                ps.tp_all_reduce_sum(torch.ones(4, 8))
        except Exception as exc:  # a pairing of mismatched sizes would raise here
            errors.append(f"{type(exc).__name__}: {exc}"[:200])

    th = threading.Thread(target=target, daemon=True)
    th.start()
    th.join(timeout=2.0)
    return {"hung": True, "blocked": th.is_alive(), "errors": errors}


def _run(pp: int, tp: int, exercise: str = "_exercise") -> dict[int, dict]:
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
            [
                sys.executable,
                "-c",
                WORKER,
                str(r),
                str(world),
                str(pp),
                str(tp),
                __file__,
                exercise,
            ],
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
@pytest.mark.process
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
    # One TP GroupCoordinator per stage, with two communicators over the same ranks.
    assert [res[r]["tp_ranks"] for r in range(4)] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert [res[r]["rank_in_group"] for r in range(4)] == [0, 1, 0, 1]
    assert all(res[r]["distinct_groups"] for r in range(4))
    assert {res[r]["model_sum"] for r in range(4)} == {3.0}, "row-parallel sum over the TP pair"
    assert {res[r]["async_min"] for r in range(4)} == {20}, "the async vote MINs every rank"


@pytest.mark.usefixtures("no_leftover_processes")
@pytest.mark.process
def test_skipped_hicache_collective_hangs_instead_of_pairing_with_the_model_all_reduce():
    res = _run(pp=1, tp=2, exercise="_skip_hicache_collective")
    for r in (0, 1):
        assert res[r]["errors"] == [], f"rank {r}: the two all-reduces paired up: {res[r]}"
        assert res[r]["blocked"], f"rank {r} returned: the collectives must not complete"


def test_group_coordinator_and_backends():
    g = GroupCoordinator((2, 3), 1, device_group="dev", cpu_group="cpu")
    assert g.world_size == 2
    # The cpu group is gloo whatever the device; the model's group follows --device (SGLang).
    assert DEVICE_BACKENDS == {"cpu": "gloo", "cuda": "nccl"}
