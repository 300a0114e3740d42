"""Bisect throughput on this machine: 2-rank trials per minute and the startup cost per trial.

    python bench/bisect.py [--trials 6] [--jobs 1,2] [-- extra run flags]

Startup cost = a trial subprocess that imports the CLI and torch and exits (`run --help`), so
it is what every trial pays before its ranks start. Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from hicache_diag.harness.bisect import BisectConfig, run_bisect

CLI = [sys.executable, "-m", "hicache_diag.cli.main"]
TINY = ("--requests", "8", "--max-new-tokens", "4")


def startup_cost(samples: int = 3) -> float:
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        subprocess.run([*CLI, "run", "--help"], capture_output=True, check=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def trials_per_minute(trials: int, jobs: int, run_args: tuple[str, ...]) -> tuple[float, int]:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = BisectConfig((), trials, jobs, 0, Path(tmp), run_args, trial_timeout_s=120)
        t0 = time.perf_counter()
        table = run_bisect(cfg)
        wall = time.perf_counter() - t0
    cell = table.cells[0].to_json()
    return 60.0 * cell["trials"] / wall, len(cell["errors"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=6)
    ap.add_argument("--jobs", default="1,2")
    ap.add_argument("run_args", nargs="*")
    ns = ap.parse_args()
    run_args = tuple(ns.run_args) or TINY
    table = Table(title=f"bisect throughput (2-rank trials, run {' '.join(run_args)})")
    for col in ("jobs", "trials", "trials/min", "errors", "startup s/trial"):
        table.add_column(col, justify="right")
    start = startup_cost()
    for jobs in (int(j) for j in ns.jobs.split(",")):
        rate, errors = trials_per_minute(ns.trials, jobs, run_args)
        table.add_row(str(jobs), str(ns.trials), f"{rate:.1f}", str(errors), f"{start:.2f}")
    Console().print(table)


if __name__ == "__main__":
    main()
