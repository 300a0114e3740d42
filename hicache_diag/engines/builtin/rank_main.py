"""Per-rank entry (ours):
`python -m hicache_diag.engines.builtin.rank_main --run-dir DIR [--rank R]`.

Started by the launcher, as `python -m` (spawn) or as a fork of the launcher that runs this
module as __main__ (fork: torch is already imported), with the TCPStore port on --store-port or
on a pipe (--store-fd); or by torchrun (env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).
Sets the process title first so triage can find the rank while torch is still importing.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import logging
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

import setproctitle

from hicache_diag import evidence as ev
from hicache_diag.trials.rundir import write_json
from hicache_diag.trials.signals import die_with_parent

_T0 = time.time()  # this module is running: start-up phases after `launch` count from here

# What a rank imports on its way to the first step: the launcher imports it once before forking
# so forks find it loaded, and a warm trial server before its trials.
RANK_PRELOAD = (
    "setproctitle",
    "hicache_diag.trials.rundir",
    "hicache_diag.options.workloads",
    "hicache_diag.faults",  # every injector module, installed by each rank
    "hicache_diag.engines.builtin.probes.recorder",
    "hicache_diag.engines.builtin.runtime.distributed.parallel_state",
    "hicache_diag.engines.builtin.runtime.managers.scheduler",
    "hicache_diag.engines.builtin.runtime.mem_cache.kv_cache_builder",
)

# Set by the launcher: its pid, and when it started this rank (time.time()).
LAUNCHER_PID_ENV = "HICACHE_DIAG_LAUNCHER_PID"
LAUNCHED_AT_ENV = "HICACHE_DIAG_LAUNCHED_AT"


def _die_with_parent() -> None:
    """The launcher's death takes every rank with it."""
    if not die_with_parent():
        return
    # A launcher that died before prctl ran sent no signal: this rank was already re-parented.
    launcher = os.environ.get(LAUNCHER_PID_ENV)
    if launcher and os.getppid() != int(launcher):
        os._exit(1)


def _setup_logging(pp: int, tp: int) -> None:
    fmt = f"[%(asctime)s PP{pp} TP{tp}] %(message)s"
    logging.basicConfig(
        level=logging.INFO, format=fmt, datefmt="%Y-%m-%d %H:%M:%S", stream=sys.stderr, force=True
    )


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="hicache_diag.engines.builtin.rank_main")
    ap.add_argument("--run-dir", required=True, type=Path)
    ap.add_argument("--rank", type=int, default=None)
    ap.add_argument("--store-port", type=int, default=None)
    ap.add_argument("--store-fd", type=int, default=None, help="read the store port from this fd")
    return ap.parse_args(argv)


def _install_faults(hooks, cfg, rank: int, pp: int, tp: int) -> list[str]:
    if not cfg.faults:
        return []
    try:
        from hicache_diag.faults import install_faults
    except ImportError:  # the faults package has not landed in this tree
        logging.warning("faults requested but hicache_diag.faults.install_faults is missing")
        return []
    return install_faults(hooks, list(cfg.faults), cfg.seed, rank=rank, pp_rank=pp, tp_rank=tp)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    rank = args.rank if args.rank is not None else int(os.environ["RANK"])
    from hicache_diag.engines.builtin.manifest import load_config

    cfg = load_config(args.run_dir)
    sa = cfg.server_args
    pp, tp = divmod(rank, sa.tp_size)
    setproctitle.setproctitle(f"hicache-diag::scheduler_PP{pp}_TP{tp}")
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C belongs to the launcher, which reaps
    stacks = open(ev.stack_txt(args.run_dir, rank), "w")  # noqa: SIM115
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    _setup_logging(pp, tp)
    port = args.store_port if args.store_fd is None else _read_port(args.store_fd)
    return run_rank(cfg, args.run_dir, rank, pp, tp, port)


def _read_port(fd: int) -> int:
    """The fork path: the launcher writes its TCPStore port here once the store exists (it
    creates the store after forking, so no server thread is ever forked)."""
    with os.fdopen(fd, "rb") as pipe:
        line = pipe.readline()
    if not line.strip():
        raise SystemExit("launcher closed the store-port pipe without a port")
    return int(line)


def _startup_times(**marks: float) -> dict[str, float | str]:
    """Start-up phases in seconds, for bench/startup.py: `launch` (launcher start -> this
    module running: interpreter start in spawn mode, the fork in fork mode), `entry`, `torch`,
    `gloo`, `build` (caches, model, recorder); `launched_at` is absolute (time.time())."""
    launched = float(os.environ.get(LAUNCHED_AT_ENV) or _T0)
    method = os.environ.get("HICACHE_DIAG_RANK_START", "external")
    out: dict[str, float | str] = {"method": method, "launched_at": launched}
    out["launch"] = round(_T0 - launched, 4)
    prev = _T0
    for name, t in marks.items():
        out[name] = round(t - prev, 4)
        prev = t
    out["total"] = round(prev - launched, 4)
    return out


def _join_world(rank: int, world_size: int, store_port: int | None, timeout_s: float) -> None:
    import torch.distributed as dist

    from hicache_diag.engines.builtin.runtime.distributed.parallel_state import init_distributed

    store = None
    if store_port is not None:
        store = dist.TCPStore(
            "127.0.0.1", store_port, world_size, is_master=False, timeout=timedelta(seconds=60)
        )
    init_distributed(rank, world_size, store, timeout_s)


def run_rank(cfg, run_dir: Path, rank: int, pp: int, tp: int, store_port: int | None) -> int:
    """Run the scheduler, then write PP0's outputs and leave the gloo world together."""
    t_entry = time.time()
    import torch

    torch.set_num_threads(1)
    from hicache_diag.engines.builtin.runtime.managers.scheduler import run_scheduler_process

    state: dict = {"t_entry": t_entry, "t_torch": time.time()}
    scheduler = run_scheduler_process(
        lambda: _make_scheduler(cfg, run_dir, rank, pp, tp, store_port, state)
    )
    state["recorder"].close()
    state["bundle"].shutdown()
    if rank == 0:
        write_json(run_dir / ev.OUTPUTS, scheduler.finished_outputs)
    logging.info("rank %d done after %d steps", rank, scheduler.step)
    _shutdown()
    return 0


def _make_scheduler(cfg, run_dir: Path, rank: int, pp: int, tp: int, store_port, state: dict):
    """Join gloo, build hooks (+ faults), comm, caches, recorder and the Scheduler."""
    from hicache_diag.engines.builtin.probes.recorder import RankRecorder
    from hicache_diag.engines.builtin.runtime.distributed.parallel_state import ParallelState
    from hicache_diag.engines.builtin.runtime.managers.scheduler import Scheduler
    from hicache_diag.engines.builtin.runtime.mem_cache.kv_cache_builder import build_kv_cache
    from hicache_diag.faults.hooks import Hooks
    from hicache_diag.options.workloads import Workload

    sa = cfg.server_args
    _join_world(rank, sa.world_size, store_port, timeout_s=max(600.0, cfg.hang_timeout * 4))
    t_gloo = time.time()
    hooks = Hooks(rank=rank, pp_rank=pp, tp_rank=tp)
    installed = _install_faults(hooks, cfg, rank, pp, tp)
    comm = ParallelState(pp, sa.pp_size, tp, sa.tp_size, hooks, device=sa.device)
    l3_dir = str(run_dir / "hicache-storage")  # without --hicache-storage-dir: this run's own
    state["bundle"] = bundle = build_kv_cache(sa, cfg.protocol, comm, hooks, pp, tp, l3_dir)
    storage = sa.hicache_storage_backend != "none"
    path = ev.rank_jsonl(run_dir, rank)
    state["recorder"] = recorder = RankRecorder(
        path, rank, pp, tp, protocol=cfg.protocol, storage=storage
    )
    workload = Workload(cfg.workload, sa)
    layers = list(sa.layers_of_stage(pp))
    logging.info("rank %d up: layers %s, faults %s", rank, layers, installed or "none")
    source = workload.arrivals if pp == 0 else None
    budget = (
        (lambda steps, left: _write_budget(run_dir, cfg.step_budget, steps, left))
        if (rank == 0)
        else None
    )
    scheduler = Scheduler(
        cfg, comm, bundle, hooks, recorder, source, workload.last_arrival_step, budget
    )
    times = _startup_times(
        entry=state["t_entry"], torch=state["t_torch"], gloo=t_gloo, build=time.time()
    )
    logging.info("rank %d startup %s", rank, json.dumps(times))
    return scheduler


def _write_budget(run_dir: Path, budget: int, steps: int, unfinished: int) -> None:
    """budget.json: PP0 stopped on the step budget with requests left (docs/evidence.md)."""
    write_json(run_dir / ev.BUDGET, ev.Budget(budget, steps, unfinished))


def _shutdown() -> None:
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
