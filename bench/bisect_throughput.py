"""Bisect throughput on this machine: 2-rank trials per minute and the startup cost per trial.

    python bench/bisect_throughput.py [--trials 6] [--jobs 1,2] [--methods spawn,fork]
                                      [-- extra run flags]

Startup cost per trial = CLI import (`run --help`) + the time from the launcher's start to the
first step any rank records (rank processes starting, importing torch, joining gloo). Each row
is measured now, for each rank start method (`$HICACHE_DIAG_RANK_START`, which every trial
inherits): `spawn` (before: `python -m` per rank) and `fork` (after: forks of the launcher with
torch imported). `outside s` = wall time per trial slot (60 / trials per minute x jobs) minus
the trial's own duration: the trial process around the trial loop (bisect's trials are forks of
its warm trial server, trials/trial_server.py, unless HICACHE_DIAG_TRIAL_START=spawn), the part
a fork per rank cannot remove. With --warm, one more row: trials one after another, each the
`run` CLI forked from this process with the CLI and torch imported. Prints a table; asserts
nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from rich.console import Console
from rich.table import Table

from hicache_diag.cli.bisect import with_cell_configs
from hicache_diag.cli.run import options_from_argv
from hicache_diag.engines.builtin.rank_main import RANK_PRELOAD
from hicache_diag.trials.bisect import BisectConfig, run_bisect
from hicache_diag.trials.forked_process import fork_module, preload

CLI = [sys.executable, "-m", "hicache_diag.cli.main"]
TINY = ("--requests", "8", "--max-new-tokens", "4")


def startup_cost(samples: int = 3) -> float:
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        subprocess.run([*CLI, "run", "--help"], capture_output=True, check=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _rank_startup(run_dir: Path) -> float | None:
    """Seconds from the launcher's start to the first recorded step of any rank."""
    try:
        started = json.loads((run_dir / "launcher.json").read_text())["started_at"]
        t0 = datetime.fromisoformat(started).timestamp()
        firsts = [json.loads(p.read_text().splitlines()[0])["t"] for p in run_dir.glob("*.jsonl")]
    except (OSError, KeyError, ValueError, IndexError):
        return None
    return min(firsts) - t0 if firsts else None


def trials_per_minute(trials: int, jobs: int, run_args: tuple[str, ...], method: str):
    """(trials per minute, errors, median rank start-up seconds, median trial seconds)."""
    os.environ["HICACHE_DIAG_RANK_START"] = method  # the trials' `run` subprocesses inherit it
    with tempfile.TemporaryDirectory() as tmp:
        bisect = BisectConfig((), trials, jobs, 0, Path(tmp), run_args)
        cfg, _ = with_cell_configs(options_from_argv(list(run_args)), bisect, 120)
        t0 = time.perf_counter()
        table = run_bisect(cfg)
        wall = time.perf_counter() - t0
        cell = table.cells[0].to_json()
        ups = [u for d in cell["run_dirs"] if (u := _rank_startup(Path(d))) is not None]
        durs = [r.duration_s for r in table.cells[0].results if r.duration_s]
    med = statistics.median
    return (
        60.0 * cell["trials"] / wall,
        len(cell["errors"]),
        med(ups) if ups else float("nan"),
        med(durs) if durs else float("nan"),
    )


def warm_trials_per_minute(trials: int, run_args: tuple[str, ...]):
    """Prototype: trials one after another, each forked from this warm process (jobs 1)."""
    os.environ["HICACHE_DIAG_RANK_START"] = "fork"
    preload(("torch", "hicache_diag.cli.main", "hicache_diag.trials.trial", *RANK_PRELOAD))
    preload(("hicache_diag.diagnosis.classify",))
    ups, durs, errors = [], [], 0
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        for i in range(trials):
            out = Path(tmp) / f"trial{i}"
            argv = ["run", *run_args, "--seed", str(i), "--json", "--out", str(out)]
            with open(Path(tmp) / f"trial{i}.log", "ab") as log:
                rc = fork_module("hicache_diag.cli.main", argv, log.fileno(), {}).wait()
            errors += rc not in (0, 10, 11, 12, 13, 14, 15)
            if (up := _rank_startup(out)) is not None:
                ups.append(up)
            if (out / "verdict.json").exists():
                durs.append(json.loads((out / "verdict.json").read_text())["duration_s"])
        wall = time.perf_counter() - t0
    med = statistics.median
    return (
        60.0 * trials / wall,
        errors,
        med(ups) if ups else float("nan"),
        med(durs) if durs else float("nan"),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=6)
    ap.add_argument("--jobs", default="1,2")
    ap.add_argument("--methods", default="spawn,fork", help="rank start methods to compare")
    ap.add_argument("--warm", action="store_true", help="add the warm trial-server prototype")
    ap.add_argument("run_args", nargs="*")
    ns = ap.parse_args()
    run_args = tuple(ns.run_args) or TINY
    table = Table(title=f"bisect throughput (2-rank trials, run {' '.join(run_args)})")
    cols = (
        "start",
        "jobs",
        "trials",
        "trials/min",
        "errors",
        "CLI import s",
        "rank start-up s",
        "trial s",
        "start-up share",
        "outside s",
    )
    for col in cols:
        table.add_column(col, justify="right")
    start = startup_cost()
    for method in ns.methods.split(","):
        for jobs in (int(j) for j in ns.jobs.split(",")):
            rate, errors, up, dur = trials_per_minute(ns.trials, jobs, run_args, method)
            table.add_row(
                method,
                str(jobs),
                str(ns.trials),
                f"{rate:.1f}",
                str(errors),
                f"{start:.2f}",
                f"{up:.2f}",
                f"{dur:.2f}",
                f"{up / dur:.0%}",
                f"{60 / rate * jobs - dur:.2f}",
            )
    if ns.warm:
        rate, errors, up, dur = warm_trials_per_minute(ns.trials, run_args)
        table.add_row(
            "fork+warm",
            "1",
            str(ns.trials),
            f"{rate:.1f}",
            str(errors),
            "0",
            f"{up:.2f}",
            f"{dur:.2f}",
            f"{up / dur:.0%}",
            f"{60 / rate - dur:.2f}",
        )
    Console(width=140).print(table)


if __name__ == "__main__":
    main()
