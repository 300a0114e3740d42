"""Rank start-up cost per rank, for each start method: where the seconds before step 0 go.

    python bench/startup.py [--repeat 3] [--methods spawn,fork] [-- extra run flags]

Runs the real CLI (`hicache-diag run`, 2 ranks by default) `--repeat` times per start method
($HICACHE_DIAG_RANK_START) and reads what each rank logged (`rank R startup {...}`) and wrote
(first jsonl line). Per rank, medians over the repeats:
  launch  launcher start -> rank module running (spawn: interpreter start; fork: the fork)
  torch   `import torch` in the rank (0 when forked: the launcher imported it)
  gloo    TCPStore client + gloo process group
  build   caches, model, recorder, scheduler
  first   launcher start -> first step recorded
and per run: the CLI's wall time and the trial's own duration (verdict duration_s). Prints
tables; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from rich.console import Console
from rich.table import Table

CLI = [sys.executable, "-m", "hicache_diag.cli.main", "run"]
TINY = ("--requests", "8", "--max-new-tokens", "4")
STARTUP = re.compile(r"rank (\d+) startup (\{.*\})$")
PHASES = ("launch", "torch", "gloo", "build", "first")


def run_once(method: str, out: Path, run_args: tuple[str, ...]) -> tuple[float, dict]:
    """One CLI run; (CLI wall seconds, verdict)."""
    env = {**os.environ, "HICACHE_DIAG_RANK_START": method}
    t0 = time.perf_counter()
    proc = subprocess.run(
        [*CLI, *run_args, "--json", "--out", str(out)], capture_output=True, text=True, env=env
    )
    wall = time.perf_counter() - t0
    if proc.returncode not in (0, 10, 11, 12, 13, 14, 15):
        raise SystemExit(f"run failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    return wall, json.loads(proc.stdout)


def rank_phases(out: Path) -> dict[int, dict[str, float]]:
    """Per rank: the logged start-up phases plus `first` (launch -> first step)."""
    phases: dict[int, dict[str, float]] = {}
    for log in sorted(out.glob("rank*.log")):
        for line in log.read_text(errors="replace").splitlines():
            if m := STARTUP.search(line):
                rank, rec = int(m.group(1)), json.loads(m.group(2))
                phases[rank] = {k: float(rec[k]) for k in PHASES[:-1]}
                phases[rank]["first"] = _first_step(out, rank) - float(rec["launched_at"])
    return phases


def _first_step(out: Path, rank: int) -> float:
    with open(out / f"rank{rank}.jsonl") as fh:
        return float(json.loads(fh.readline())["t"])


def measure(method: str, repeat: int, run_args: tuple[str, ...]) -> tuple[dict, list, list]:
    per_rank: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    walls, trials = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeat):
            out = Path(tmp) / f"{method}{i}"
            wall, verdict = run_once(method, out, run_args)
            walls.append(wall)
            trials.append(float(verdict["duration_s"]))
            for rank, ph in rank_phases(out).items():
                for k, v in ph.items():
                    per_rank[rank][k].append(v)
    return per_rank, walls, trials


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--methods", default="spawn,fork")
    ap.add_argument("run_args", nargs="*")
    ns = ap.parse_args()
    run_args = tuple(ns.run_args) or TINY
    med = statistics.median
    ranks = Table(title=f"rank start-up, median of {ns.repeat} (run {' '.join(run_args)})")
    for col in ("method", "rank", *(f"{p} s" for p in PHASES)):
        ranks.add_column(col, justify="right")
    runs = Table(title="per run")
    for col in ("method", "CLI wall s", "trial s"):
        runs.add_column(col, justify="right")
    for method in ns.methods.split(","):
        per_rank, walls, trials = measure(method, ns.repeat, run_args)
        for rank, ph in sorted(per_rank.items()):
            ranks.add_row(method, str(rank), *(f"{med(ph[p]):.3f}" for p in PHASES))
        runs.add_row(method, f"{med(walls):.2f}", f"{med(trials):.2f}")
    console = Console(width=120)
    console.print(ranks)
    console.print(runs)


if __name__ == "__main__":
    main()
