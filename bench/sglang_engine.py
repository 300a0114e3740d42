"""What the real engine costs: SGLang start-up, per-request time and shutdown under the harness.

Each trial is a fresh `hicache-diag run --engine sglang` CLI process (PP2, HiCache L2; with
`--l3`, the file backend over one directory, so trials after the first start warm). Figures come
from the run's launcher.json (`startup_s`: launch to the first healthy /health_generate;
`per_request_s`: workload wall time / completed requests, waves of pp_size; `shutdown_s`: reaping
the whole process tree) and the CLI's own wall time. Prints a table; never asserts on time.
Usage: python bench/sglang_engine.py [--trials 3] [--requests 24] [--l3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CLI = [sys.executable, "-m", "hicache_diag.cli.main", "run", "--engine", "sglang", "--json"]
KEYS = ("startup_s", "per_request_s", "workload_s", "shutdown_s", "wall_s")


def one_trial(out: Path, requests: int, l3: Path | None) -> dict:
    args = ["--out", str(out), "--requests", str(requests)]
    if l3 is not None:
        args += ["--storage-backend", "file", "--storage-dir", str(l3)]
    t0 = time.time()
    proc = subprocess.run([*CLI, *args], capture_output=True, text=True, check=False)
    wall = time.time() - t0
    verdict = json.loads(proc.stdout) if proc.stdout.strip() else {"outcome": "no verdict"}
    timings = json.loads((out / "launcher.json").read_text()).get("timings", {})
    return {"outcome": verdict.get("outcome"), "wall_s": round(wall, 2), **timings}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--l3", action="store_true", help="file L3 backend over one directory")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        l3 = Path(tmp) / "l3" if args.l3 else None
        for i in range(args.trials):
            row = one_trial(Path(tmp) / f"t{i}", args.requests, l3)
            rows.append(row)
            print(f"trial {i}: " + "  ".join(f"{k}={row.get(k)}" for k in ("outcome", *KEYS)))
    print(f"\nmedian of {len(rows)} trials ({args.requests} requests each):")
    for key in KEYS:
        values = [r[key] for r in rows if isinstance(r.get(key), int | float)]
        if values:
            print(f"  {key:14s} {statistics.median(values):8.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
