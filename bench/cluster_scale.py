"""Cluster triage at scale: a synthetic 64-node, 512-rank snapshot judged like a live one, and
the local executor's fan-out cost over 2, 8 and 32 collector processes.

Run from the project root:  python bench/cluster_scale.py [--nodes 64] [--fanout 2,8,32]
1. Snapshot: the collector documents 64 nodes would send (8 schedulers each, PP8 x TP64),
   their stacks taken from the real py-spy dumps in samples/dumps/pp_hang_pp_sync (PP0's
   receive for ranks of stages 0-6, PP1's `_pp_sync` for the last stage, as in that hang);
   merged and classified by the same code as `triage --live` (hicache_diag/triage/cluster_merge.py,
   triage/classify.py); the bundle `--save` would write is written and measured.
2. Fan-out: N real collectors through the local executor (`python3 -c BOOTSTRAP` with the
   collector on stdin), all told to sample at one instant: wall time to all answers, and the
   skew of their first samples. Prints one row per measure; exits 0 (figures, not a test).
"""

from __future__ import annotations

import sys

# `python bench/x.py` puts bench/ first on sys.path, where bench/bisect.py would shadow the
# standard library's bisect: drop it before anything else.
sys.path[:] = [p for p in sys.path if not p.rstrip("/").endswith("bench")]

import argparse  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from hicache_diag.cluster.base import Node, NodeResult, Sampling  # noqa: E402
from hicache_diag.cluster.fanout import fan_out  # noqa: E402
from hicache_diag.cluster.local import LocalExecutor  # noqa: E402
from hicache_diag.evidence.stacks import parse_dump_text  # noqa: E402
from hicache_diag.triage.classify import classify  # noqa: E402
from hicache_diag.triage.cluster_merge import merge, save_bundle  # noqa: E402

DUMPS = Path(__file__).resolve().parent.parent / "samples" / "dumps" / "pp_hang_pp_sync"
PER_NODE, PP = 8, 8


def _threads(name: str) -> list[dict]:
    """A real py-spy text dump as py-spy's --json thread list (what the collector sends)."""
    dump = parse_dump_text((DUMPS / name).read_text(), name)[0]
    return [
        {
            "thread_name": t.name,
            "os_thread_id": t.tid,
            "frames": [{"name": f.name, "filename": f.filename, "line": f.line} for f in t.frames],
        }
        for t in dump.threads
    ]


def synthetic(nodes: int, at: float) -> list[NodeResult]:
    waiting, culprit = _threads("pyspy_pp0_tp0.txt"), _threads("pyspy_pp1_tp0.txt")
    tp_size = nodes * PER_NODE // PP
    results = []
    for n in range(nodes):
        procs = []
        for local in range(PER_NODE):
            flat = n * PER_NODE + local
            pp, tp = divmod(flat, tp_size)
            threads = culprit if pp == PP - 1 else waiting
            sample = {"t": at, "threads": threads, "links": [{"link": "py-spy", "ok": True}]}
            sample["proc"] = {"state": "S (sleeping)", "cpu_ticks": 100}
            title = f"sglang::scheduler_PP{pp}_TP{tp}"
            procs.append({"pid": 1000 + local, "title": title, "samples": [sample, sample]})
        doc = {"node": f"node-{n}", "at": at, "samples_at": [at + n * 1e-4], "processes": procs}
        results.append(NodeResult(Node(f"node-{n}", f"node-{n}"), doc))
    return results


def bench_snapshot(nodes: int) -> None:
    t0 = time.perf_counter()
    results = synthetic(nodes, time.time())
    t1 = time.perf_counter()
    snap = merge(results)
    t2 = time.perf_counter()
    report = classify(snap.ranks, None)
    t3 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        save_bundle(snap, Path(tmp))
        files = list(Path(tmp).iterdir())
        size = sum(f.stat().st_size for f in files)
    culprit = report.culprit.rank.label if report.culprit else None
    times = f"build={t1 - t0:.2f}s merge={t2 - t1:.2f}s classify={t3 - t2:.2f}s"
    verdict = f"verdict={report.kind}/{report.cause} culprit={culprit}"
    bundle = f"bundle={size / 1e6:.1f}MB in {len(files)} files"
    print(f"snapshot  nodes={nodes} ranks={len(snap.ranks)} {times} {verdict} {bundle}")


def bench_fanout(count: int, lead: float) -> None:
    nodes = [Node(f"local-{i}", "localhost") for i in range(count)]
    t0 = time.time()
    sampling = Sampling(at=t0 + lead, samples=1, interval=0.0, deadline=5.0, budget=60.0)
    results = fan_out(LocalExecutor(nodes=nodes), nodes, sampling, timeout=60.0)
    wall = time.time() - t0
    ok = [r for r in results if r.ok]
    firsts = [r.doc["samples_at"][0] for r in ok]
    started = [r.doc["started"] - t0 for r in ok]
    skew = max(firsts) - min(firsts) if firsts else float("nan")
    found = max((len(r.doc["processes"]) for r in ok), default=0)
    head = f"fan-out   collectors={count} answered={len(ok)} wall={wall:.2f}s (lead {lead:.1f}s)"
    tail = f"last-started={max(started):.2f}s skew={skew * 1000:.0f}ms schedulers-here={found}"
    print(f"{head} {tail}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--fanout", default="2,8,32")
    parser.add_argument("--lead", type=float, default=4.0, help="seconds before the instant")
    args = parser.parse_args()
    bench_snapshot(args.nodes)
    for count in (int(c) for c in args.fanout.split(",")):
        bench_fanout(count, args.lead)


if __name__ == "__main__":
    main()
