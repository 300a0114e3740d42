"""Time to reproduce each crash form from a cold start, and the hang-verdict latency.

Each trial is a fresh `hicache-diag run --scenario samples/scenarios/<form>.toml --seed S` CLI
process (torch import, rank spawn, gloo, workload, verdict), timed from exec to exit; the median
of `--trials` seeds per scenario. For form C it also reads launcher.json and verdict.json:
`detect` = hang detected - last step of any rank (the hang timeout plus one poll), `verdict` =
verdict.json written - hang detected (parallel py-spy dumps, reaping, classification).
Prints a table; never asserts on time (targets: <= 10 s per form, <= 5 s hang verdict).
Usage: python bench/ttr.py [--trials 5] [--forms form_a,form_b,form_c,healthy]
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

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "hicache_diag.cli.main", "run"]


def one_trial(form: str, seed: int, out: Path) -> dict:
    scenario = ROOT / "samples" / "scenarios" / f"{form}.toml"
    args = ["--scenario", str(scenario), "--seed", str(seed), "--out", str(out), "--json"]
    t0 = time.time()
    proc = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300)
    wall = time.time() - t0
    verdict = json.loads(proc.stdout) if proc.stdout.strip() else {}
    row = {"wall": wall, "exit": proc.returncode, "form": verdict.get("form")}
    launcher = json.loads((out / "launcher.json").read_text())
    hang = launcher.get("hang")
    if hang:
        last_step = max(float(t) for t in hang["last_progress"].values())
        row["detect"] = hang["detected_at"] - last_step
        row["verdict"] = (out / "verdict.json").stat().st_mtime - hang["detected_at"]
    return row


def measure(form: str, trials: int, tmp: Path) -> dict:
    rows = [one_trial(form, seed, tmp / f"{form}-{seed}") for seed in range(1, trials + 1)]
    out = {
        "median": statistics.median(r["wall"] for r in rows),
        "max": max(r["wall"] for r in rows),
        "exits": sorted({r["exit"] for r in rows}),
    }
    hangs = [r for r in rows if "detect" in r]
    if hangs:
        out["detect"] = statistics.median(r["detect"] for r in hangs)
        out["verdict"] = statistics.median(r["verdict"] for r in hangs)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--forms", default="form_a,form_b,form_c,healthy")
    args = parser.parse_args()
    head = f"{'scenario':<9} {'median':>8} {'max':>8}  exits     {'detect':>7} {'verdict':>8}"
    print(head + "  hang verdict after the stall")
    with tempfile.TemporaryDirectory(prefix="hicache-ttr-") as tmp:
        for form in args.forms.split(","):
            r = measure(form, args.trials, Path(tmp))
            hang = ""
            if "detect" in r:
                total = r["detect"] + r["verdict"]
                hang = f"{r['detect']:>6.2f}s {r['verdict']:>7.2f}s  {total:>6.2f}s"
            exits = ",".join(map(str, r["exits"]))
            print(f"{form:<9} {r['median']:>7.2f}s {r['max']:>7.2f}s  {exits:<8}  {hang}")
    print(
        f"(cold start to exit, median of {args.trials} seeds; detect = hang detected - last "
        "step; verdict = verdict.json - detection)"
    )


if __name__ == "__main__":
    main()
