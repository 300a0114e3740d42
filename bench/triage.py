"""Time to dump and classify N live ranks (N = 2, 4, 8), spawned as real gloo processes.

Prints a table; never asserts on time (the target is <= 2 s for 8 ranks with two samples).
Usage: python bench/triage.py [--sizes 2,4,8] [--interval 0.5]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "unit" / "triage"))

from triage_cluster import FakeCluster  # noqa: E402

from hicache_diag.triage import TriageRequest, run_triage  # noqa: E402
from hicache_diag.triage.classify import classify  # noqa: E402
from hicache_diag.triage.collect import capture_live  # noqa: E402


def measure(world: int, interval: float) -> dict[str, float | str]:
    with FakeCluster("pp-hang", world) as cluster:
        t0 = time.perf_counter()
        ranks = capture_live(cluster.pids, samples=1, deadline_s=10)
        t1 = time.perf_counter()
        classify(ranks)
        t2 = time.perf_counter()
        report = run_triage(TriageRequest(pids=tuple(cluster.pids), interval=interval))
        t3 = time.perf_counter()
    culprit = report.culprit.rank.label if report.culprit else "-"
    return {
        "dump_s": t1 - t0,
        "classify_s": t2 - t1,
        "triage_s": t3 - t2,
        "verdict": f"{report.kind}/{report.cause} {culprit}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2,4,8")
    parser.add_argument("--interval", type=float, default=0.5)
    args = parser.parse_args()
    print(f"{'ranks':>5} {'1 dump pass':>12} {'classify':>9} {'triage (2 samples)':>19}  verdict")
    for world in (int(s) for s in args.sizes.split(",")):
        row = measure(world, args.interval)
        print(
            f"{world:>5} {row['dump_s']:>11.3f}s {row['classify_s']:>8.4f}s "
            f"{row['triage_s']:>18.3f}s  {row['verdict']}"
        )
    print(f"(triage = 2 parallel py-spy passes {args.interval}s apart + classification)")


if __name__ == "__main__":
    main()
