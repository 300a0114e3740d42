"""Probe cost: scheduler steps/s with the per-step evidence recorded and with it switched off.

    python bench/probe_cost.py [--topologies 2x1,4x1,2x2] [--repeat 5] [--requests 32]
                               [-- extra run flags]

`HICACHE_DIAG_RECORD=0` (probes/recorder.py) makes each rank write a heartbeat line per step
instead of the full record (no tree digest, no probe fields, no JSON of the queues), so the
difference is what the recording costs the scheduler thread. Runs alternate on and off so a
change in the machine's load hits both; steps/s is PP0 TP0's, from its line timestamps; the
median of `--repeat` pairs. On a shared, loaded box that difference is mostly noise, so each
recorded line also carries `record_s`, the time the previous line took to build and write,
measured inside the rank: `record ms` and `share` (record time / step interval, PP0 TP0, median
over the runs) are the in-run figure, immune to the machine's load changing between runs.
Goal (issue 14): at most 3% slower with recording on. Prints a table; asserts nothing.
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


def _lines(out: Path) -> list[dict]:
    lines = [json.loads(x) for x in (out / "rank0.jsonl").read_text().splitlines() if x.strip()]
    return [x for x in lines if not x.get("crashed")]


def steps_per_s(out: Path) -> float:
    lines = _lines(out)
    span = lines[-1]["t"] - lines[0]["t"]
    return (len(lines) - 1) / span if span > 0 else 0.0


def record_share(out: Path) -> tuple[float, float]:
    """(mean seconds one full record took, that / mean step interval), from `record_s`."""
    lines = _lines(out)
    costs = [x["record_s"] for x in lines[1:] if "record_s" in x]
    span = lines[-1]["t"] - lines[0]["t"]
    if not costs or span <= 0:
        return float("nan"), float("nan")
    mean = statistics.mean(costs)
    return mean, mean / (span / (len(lines) - 1))


def one_run(pp: int, tp: int, record: bool, args: tuple[str, ...], out: Path) -> tuple:
    env = {**os.environ, "HICACHE_DIAG_RECORD": "1" if record else "0"}
    argv = [*CLI, "--pp", str(pp), "--tp", str(tp), *args, "--json", "--out", str(out)]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    outcome = json.loads(proc.stdout).get("outcome") if proc.stdout.strip() else "?"
    return steps_per_s(out), str(outcome), record_share(out) if record else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topologies", default="2x1,4x1,2x2", help="PPxTP list")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("run_args", nargs="*", help="extra run flags (after --)")
    ns = ap.parse_args()
    args = tuple(ns.run_args) or DEFAULT_ARGS
    print(f"run {' '.join(args)}; median of {ns.repeat} alternating pairs")
    print(
        f"{'topology':<9}{'on steps/s':>12}{'off steps/s':>13}{'cost':>8}{'record ms':>11}"
        f"{'share':>8}  outcomes (on / off)"
    )
    with tempfile.TemporaryDirectory(prefix="hicache-probe-") as tmp:
        for topo in ns.topologies.split(","):
            pp, tp = (int(x) for x in topo.split("x"))
            on, off, outcomes, shares = [], [], {True: set(), False: set()}, []
            for i in range(ns.repeat):
                for record, acc in ((True, on), (False, off)):
                    out = Path(tmp) / f"{topo}-{i}-{record}"
                    rate, outcome, share = one_run(pp, tp, record, args, out)
                    acc.append(rate)
                    outcomes[record].add(outcome)
                    if share:
                        shares.append(share)
            m_on, m_off = statistics.median(on), statistics.median(off)
            cost = (m_off - m_on) / m_off if m_off else float("nan")
            seen = " / ".join(",".join(sorted(outcomes[k])) for k in (True, False))
            rec_ms = statistics.median(x[0] for x in shares) * 1e3
            share = statistics.median(x[1] for x in shares)
            print(
                f"PP{pp} TP{tp:<4}{m_on:>12.1f}{m_off:>13.1f}{cost:>8.1%}{rec_ms:>11.3f}"
                f"{share:>8.1%}  {seen}"
            )
    print("(cost = 1 - on/off steps/s, between runs; share = in-run record time / step interval)")


if __name__ == "__main__":
    main()
