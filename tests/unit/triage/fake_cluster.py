"""A tiny real cluster for live triage tests: N processes titled like schedulers, joined by gloo,
each parked in a real wait (gloo recv / all_reduce / broadcast, queue.get, Event.wait) under
SGLang's function names, so py-spy sees the same call chains as on a real server.

Run one rank: `python fake_cluster.py SCENARIO RANK WORLD PORT [TP]`. Every rank exits on its
own after LIFETIME_S, so nothing outlives a broken test. Not collected by pytest (no test_ prefix).
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time

LIFETIME_S = 90.0


# --- SGLang-named call chains (names matter: they are what triage reads) ----------------------


def recv_object(src):
    import torch
    import torch.distributed as dist

    t = torch.zeros(1)
    dist.recv(t, src=src)


def recv_tensor_dict(src):
    recv_object(src)


def _pp_recv_proxy_tensors(src):
    recv_tensor_dict(src)


def _pp_sync(src):
    import torch
    import torch.distributed as dist

    t = torch.zeros(2)
    dist.recv(t, src=src)


def _all_reduce(src):
    _pp_sync(src)


def _all_reduce_attn_groups(group):
    import torch
    import torch.distributed as dist

    dist.all_reduce(torch.ones(2), group=group)


def broadcast_pyobj(group):
    import torch
    import torch.distributed as dist

    dist.broadcast(torch.zeros(1), src=0, group=group)


def recv_requests_broadcast(group):
    broadcast_pyobj(group)


def writing_check(mode, arg):
    if mode == "pp":
        _all_reduce(arg)
    elif mode == "tp":
        _all_reduce_attn_groups(arg)
    else:
        synchronize(threading.Event())


def synchronize(event):
    event.wait()


def _drain_queue(q):
    q.get()


def drain_storage_control_queues():
    _drain_queue(queue.Queue())


def check_hicache_events(mode, arg):
    if mode == "queue":
        drain_storage_control_queues()
    else:
        writing_check(mode, arg)


def forward(x):
    import torch

    for _ in range(20):
        x = torch.tanh(x @ x)
    return x


def run_batch(x):
    return forward(x)


def scheduler_step(ms):
    time.sleep(ms / 1000)


def point_to_point_pyobj(src):
    recv_object(src)


def recv_requests(src):
    point_to_point_pyobj(src)


def on_idle():
    time.sleep(0.001)


# --- scenarios ------------------------------------------------------------------------------


def event_loop_pp(scenario, rank, world, tp):
    import torch
    import torch.distributed as dist

    prev = (rank - tp) % world
    culprit = world - 1
    tp_groups = [dist.new_group(list(range(world))), dist.new_group(list(range(world)))]
    print("READY", flush=True)
    if scenario in ("pp-hang", "queue-hang", "sync-hang") and rank == culprit:
        mode = {"pp-hang": "pp", "queue-hang": "queue", "sync-hang": "sync"}[scenario]
        check_hicache_events(mode, prev)
    elif scenario == "tp-hang":
        if rank == 0:
            check_hicache_events("tp", tp_groups[0])
        else:
            recv_requests_broadcast(tp_groups[1])
    elif scenario == "straggler" and rank == culprit:
        while True:
            scheduler_step(200)
    elif scenario == "busy":
        x = torch.rand(48, 48) / 48
        while True:
            x = run_batch(x)
            scheduler_step(1)
    elif scenario == "idle":
        while rank == 0:
            on_idle()
        recv_requests(prev)
    _pp_recv_proxy_tensors(prev)  # every other rank waits for its upstream stage


def main() -> None:
    scenario, rank, world, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    tp = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    threading.Timer(LIFETIME_S, os._exit, args=(0,)).start()
    import setproctitle
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    setproctitle.setproctitle(f"hicache-diag::scheduler_PP{rank // tp}_TP{rank % tp}")
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    event_loop_pp(scenario, rank, world, tp)


if __name__ == "__main__":
    main()
