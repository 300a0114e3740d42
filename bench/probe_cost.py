"""Probe cost: scheduler steps/s with the per-step evidence recorded and with it switched off.

    python bench/probe_cost.py [--topologies 2x1,4x1,2x2] [--repeat 5] [--requests 32]
                               [-- extra run flags]

`HICACHE_DIAG_RECORD=0` (probes/recorder.py) makes each rank write a heartbeat line per step
instead of the full record (no tree digest, no probe fields, no JSON of the queues), so the
difference is what the recording costs the scheduler thread. Runs alternate on and off so a
change in the machine's load hits both; steps/s is PP0 TP0's, from its line timestamps; the
median of `--repeat` pairs. Goal (issue 14): at most 3% slower with recording on. Prints a
table; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CLI = [sys.executable, "-m", "hicache_diag.cli.main", "run"]
DEFAULT_ARGS = ("--requests", "32", "--max-total-tokens", "256")


def steps_per_s(out: Path) -> float:
    lines = [json.loads(x) for x in (out / "rank0.jsonl").read_text().splitlines() if x.strip()]
    lines = [x for x in lines if not x.get("crashed")]
    span = lines[-1]["t"] - lines[0]["t"]
    return (len(lines) - 1) / span if span > 0 else 0.0


def one_run(pp: int, tp: int, record: bool, args: tuple[str, ...], out: Path) -> tuple[float, str]:
    env = {**os.environ, "HICACHE_DIAG_RECORD": "1" if record else "0"}
    argv = [*CLI, "--pp", str(pp), "--tp", str(tp), *args, "--json", "--out", str(out)]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    outcome = json.loads(proc.stdout).get("outcome") if proc.stdout.strip() else "?"
    return steps_per_s(out), str(outcome)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topologies", default="2x1,4x1,2x2", help="PPxTP list")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("run_args", nargs="*", help="extra run flags (after --)")
    ns = ap.parse_args()
    args = tuple(ns.run_args) or DEFAULT_ARGS
    print(f"run {' '.join(args)}; median of {ns.repeat} alternating pairs")
    print(f"{'topology':<9}{'on steps/s':>12}{'off steps/s':>13}{'cost':>8}  outcomes (on / off)")
    with tempfile.TemporaryDirectory(prefix="hicache-probe-") as tmp:
        for topo in ns.topologies.split(","):
            pp, tp = (int(x) for x in topo.split("x"))
            on, off, outcomes = [], [], {True: set(), False: set()}
            for i in range(ns.repeat):
                for record, acc in ((True, on), (False, off)):
                    rate, outcome = one_run(
                        pp, tp, record, args, Path(tmp) / f"{topo}-{i}-{record}"
                    )
                    acc.append(rate)
                    outcomes[record].add(outcome)
            m_on, m_off = statistics.median(on), statistics.median(off)
            cost = (m_off - m_on) / m_off if m_off else float("nan")
            seen = " / ".join(",".join(sorted(outcomes[k])) for k in (True, False))
            print(f"PP{pp} TP{tp:<4}{m_on:>12.1f}{m_off:>13.1f}{cost:>8.1%}  {seen}")
    print("(cost = 1 - on/off steps/s; positive: recording slows the scheduler)")


if __name__ == "__main__":
    main()
