"""Protocol cost: per-step HiCache sync time and throughput for each protocol switch mode.

    python bench/sync.py [--topologies 2x1,4x1,2x2] [--repeat 3] [--requests 32]
                         [--variants full,leader,local,conditional,host-local,l3-min,l3-local]

Each variant is `hicache-diag run --protocol full` with one switch changed (`leader` =
`--switch ack-count=leader`, two pp_syncs a step; `full` uses `leader-batched`, one pp_sync
carrying write+load as #33473 does; `local` = each rank drains its own acks, no sync), on a
device pool large enough that nothing is evicted (so a legacy mode runs to the end instead of
crashing).
The `l3-*` variants turn L3 on (file backend) with the L3 MINs on their storage threads (min)
or off (local). Each rank records `sync_s` per step (seconds in each HiCache sync: the TP
all-reduce of the ack count, pp_sync, draining its isends, the host-alloc vote's wait, the L3
thread-group MINs); steps/s and tok/s come from the jsonl timestamps and outputs.json.

In the same run, `world` processes time a bare gloo all-reduce of one int64 pair on loopback
(and a bare send/recv pair), and every sync figure is also printed as a multiple of it. Medians
over `--repeat` runs. Prints tables; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

CLI = [sys.executable, "-m", "hicache_diag.cli.main", "run"]
L3 = ("--storage-backend", "file", "--hicache-storage-prefetch-policy", "wait_complete")
VARIANTS: dict[str, tuple[str, ...]] = {
    "full": (),  # ack-count=leader-batched: one relay of [write, load] per step
    "leader": ("--switch", "ack-count=leader"),  # two relays per step (before #33473)
    "local": ("--switch", "ack-count=local"),  # no sync: each rank its own count (legacy)
    "conditional": ("--switch", "tp-collective=conditional"),  # TP all-reduce skipped when empty
    "host-local": ("--switch", "host-alloc=local"),  # no two-phase vote
    "l3-min": L3,
    "l3-local": (*L3, "--switch", "l3-hit=local", "--switch", "l3-progress=local"),
}
SCHED_SYNCS = ("tp_allreduce", "world_allreduce", "pp_sync", "drain", "vote_allreduce")
THREAD_SYNCS = ("prefetch_hits", "prefetch_completion")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bare_worker(rank: int, world: int, port: int, iters: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    t = torch.zeros(2, dtype=torch.int64)
    times_ar, times_p2p = [], []
    for i in range(iters + 20):  # 20 warm-up rounds
        dist.barrier()
        t0 = _now()
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        if i >= 20:
            times_ar.append(_now() - t0)
    for i in range(iters + 20):
        dist.barrier()
        t0 = _now()
        if rank == 0:
            dist.send(t, dst=1)
            dist.recv(t, src=1)
        elif rank == 1:
            dist.recv(t, src=0)
            dist.send(t, dst=0)
        if i >= 20 and rank == 0:
            times_p2p.append((_now() - t0) / 2)  # one way
    if rank == 0:
        med = statistics.median
        Path(out).write_text(json.dumps({"all_reduce": med(times_ar), "p2p": med(times_p2p)}))
    dist.destroy_process_group()


def _now() -> float:
    import time

    return time.perf_counter()


def bare_costs(world: int, iters: int = 300) -> dict[str, float]:
    """Median seconds of one bare gloo all-reduce (int64[2]) over `world` processes, and of one
    send of the same tensor between two of them."""
    with tempfile.NamedTemporaryFile(suffix=".json") as fh:
        mp.spawn(_bare_worker, args=(world, _free_port(), iters, fh.name), nprocs=world)
        return json.loads(Path(fh.name).read_text())


def one_run(pp: int, tp: int, args: tuple[str, ...], requests: int, out: Path) -> dict:
    argv = [
        *CLI,
        "--pp",
        str(pp),
        "--tp",
        str(tp),
        "--protocol",
        "full",
        *args,
        "--requests",
        str(requests),
        "--max-total-tokens",
        "4096",
        "--json",
        "--out",
        str(out),
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    verdict = json.loads(proc.stdout) if proc.stdout.strip() else {}
    return {"outcome": verdict.get("outcome", f"exit {proc.returncode}"), **measure(out, pp, tp)}


def measure(out: Path, pp: int, tp: int) -> dict:
    """Steps/s and tok/s of PP0 TP0, and the mean per-step sync seconds of PP0 and of PP>0."""
    rows = {
        r: [json.loads(x) for x in (out / f"rank{r}.jsonl").read_text().splitlines()]
        for r in range(pp * tp)
    }
    rows = {r: [x for x in v if not x.get("crashed")] for r, v in rows.items()}
    lead = rows[0]
    span = lead[-1]["t"] - lead[0]["t"]
    tokens = 0
    if (out / "outputs.json").exists():
        outputs = json.loads((out / "outputs.json").read_text())
        tokens = sum(
            len(v.get("tokens", v) if isinstance(v, dict) else v) for v in outputs.values()
        )

    def per_step(ranks: list[int], names: tuple[str, ...]) -> float:
        sums = [sum(x.get("sync_s", {}).get(n, 0.0) for n in names) for r in ranks for x in rows[r]]
        return statistics.mean(sums) if sums else 0.0

    first = list(range(tp))
    rest = list(range(tp, pp * tp))
    pp_sync = [x.get("sync_s", {}).get("pp_sync", 0.0) for r in rest for x in rows[r]]
    return {
        "steps_s": (len(lead) - 1) / span if span > 0 else 0.0,
        "tok_s": tokens / span if span > 0 else 0.0,
        "sync_pp0": per_step(first, SCHED_SYNCS),
        "sync_rest": per_step(rest, SCHED_SYNCS),
        "pp_sync_rest": statistics.mean(pp_sync) if pp_sync else 0.0,
        "threads": per_step(list(rows), THREAD_SYNCS),
    }


def _median_of(runs: list[dict]) -> dict:
    keys = [k for k in runs[0] if k != "outcome"]
    med = {k: statistics.median(r[k] for r in runs) for k in keys}
    med["outcome"] = ",".join(sorted({r["outcome"] for r in runs}))
    return med


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topologies", default="2x1,4x1,2x2", help="PPxTP list")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ns = ap.parse_args()
    variants = ns.variants.split(",")
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        ap.error(f"unknown variant {bad[0]!r}; valid: {', '.join(VARIANTS)}")
    topologies = [tuple(int(x) for x in t.split("x")) for t in ns.topologies.split(",")]
    with tempfile.TemporaryDirectory(prefix="hicache-sync-") as tmp:
        for pp, tp in topologies:
            report_topology(pp, tp, variants, ns, Path(tmp))


def report_topology(
    pp: int, tp: int, variants: list[str], ns: argparse.Namespace, tmp: Path
) -> None:
    bare = bare_costs(pp * tp)
    ar_ms = bare["all_reduce"] * 1e3
    print(
        f"\nPP{pp} TP{tp}: bare gloo all-reduce {ar_ms * 1e3:.0f} us, one-way send "
        f"{bare['p2p'] * 1e6:.0f} us (loopback, median of 300)"
    )
    head = (
        f"{'variant':<12}{'outcome':>10}{'steps/s':>9}{'tok/s':>8}{'sync PP0':>10}{'x AR':>6}"
        f"{'sync PP>0':>10}{'x AR':>6}{'pp_sync>0':>10}{'L3 thr':>8}"
    )
    print(head + "   (sync: ms per step, x AR: multiples of one bare all-reduce)")
    results = {}
    for name in variants:
        if name == "conditional" and tp == 1:
            continue  # the switch only exists between TP ranks
        runs = [
            one_run(pp, tp, VARIANTS[name], ns.requests, tmp / f"{pp}x{tp}-{name}-{i}")
            for i in range(ns.repeat)
        ]
        m = results[name] = _median_of(runs)
        print(
            f"{name:<12}{m['outcome']:>10}{m['steps_s']:>9.1f}{m['tok_s']:>8.0f}"
            f"{m['sync_pp0'] * 1e3:>10.3f}{m['sync_pp0'] * 1e3 / ar_ms:>6.1f}"
            f"{m['sync_rest'] * 1e3:>10.3f}{m['sync_rest'] * 1e3 / ar_ms:>6.1f}"
            f"{m['pp_sync_rest'] * 1e3:>10.3f}{m['threads'] * 1e3:>8.3f}"
        )
    if "full" in results and "leader" in results:
        b, lead = results["full"], results["leader"]
        print(
            f"leader-batched vs leader: steps/s x{b['steps_s'] / lead['steps_s']:.3f}, "
            f"tok/s x{b['tok_s'] / max(lead['tok_s'], 1e-9):.3f}, pp_sync on PP>0 "
            f"{lead['pp_sync_rest'] * 1e3:.3f} -> {b['pp_sync_rest'] * 1e3:.3f} ms/step "
            "(#33473 measured x1.37 on GPU)"
        )


if __name__ == "__main__":
    main()
