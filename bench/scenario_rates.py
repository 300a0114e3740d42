"""How often each builtin sample scenario gives its expected outcome, measured under CPU load.

Runs `hicache-diag run --scenario samples/scenarios/<name>.toml` (the README's command, the
scenario's own seed) `--runs` times per scenario, one CLI process each, while one busy-loop
process per core keeps every core loaded (started before the first run, reaped at the end, also
on Ctrl-C). Per scenario it prints the outcomes seen (`hang C`, `crash A`, ...) with their counts,
and how many runs its `[expect]` table accepts (what `run --check` would pass) with a 95% Wilson
interval (diagnosis/stats.py). The sglang/ scenarios need a real SGLang release and are left out.
Usage: python bench/scenario_rates.py [--runs 20] [--scenarios form_a,form_c] [--no-load]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hicache_diag.diagnosis.stats import wilson
from hicache_diag.evidence.verdict import Verdict
from hicache_diag.faults.expect import Expectation
from hicache_diag.faults.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "samples" / "scenarios"
CLI = [sys.executable, "-m", "hicache_diag.cli.main", "run"]
BUSY = "while True: pass"


def builtin_scenarios() -> list[str]:
    return sorted(p.stem for p in SCENARIOS.glob("*.toml"))


def start_load(cores: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(cores)]


def stop_load(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.send_signal(signal.SIGKILL)
    for p in procs:
        p.wait()


def outcome_of(verdict: dict) -> str:
    form = verdict.get("form")
    return f"{verdict.get('outcome')} {form}" if form else str(verdict.get("outcome"))


def one_run(name: str, out: Path, expect: Expectation | None) -> tuple[str, bool, float]:
    """One CLI run: its outcome (`hang C`), whether `--check` would pass it, its seconds."""
    args = ["--scenario", str(SCENARIOS / f"{name}.toml"), "--out", str(out), "--json"]
    t0 = time.time()
    proc = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=600)
    wall = time.time() - t0
    try:
        data = json.loads(proc.stdout)
    except ValueError:
        return f"no verdict (exit {proc.returncode})", False, wall
    ok = expect is not None and not expect.mismatches(Verdict.from_json(data))
    return outcome_of(data), ok, wall


def measure(name: str, runs: int, tmp: Path) -> dict:
    expect = load_scenario(SCENARIOS / f"{name}.toml").expect
    seen: collections.Counter[str] = collections.Counter()
    hits, walls = 0, []
    for i in range(runs):
        outcome, ok, wall = one_run(name, tmp / f"{name}-{i}", expect)
        seen[outcome] += 1
        hits += ok
        walls.append(wall)
        print(f"  {name} #{i + 1}: {outcome} ({wall:.1f} s)", file=sys.stderr, flush=True)
    return {
        "name": name,
        "runs": runs,
        "seen": dict(seen.most_common()),
        "expected": expect.describe() if expect else "?",
        "hits": hits,
        "wilson": wilson(hits, runs),
        "median_s": statistics.median(walls),
    }


def render(row: dict) -> str:
    seen = ", ".join(f"{o} {n}" for o, n in row["seen"].items())
    lo, hi = row["wilson"]
    return (
        f"{row['name']:<14} {row['hits']:>2}/{row['runs']:<2} [{lo:.2f}, {hi:.2f}]  "
        f"{row['median_s']:5.1f} s  {seen}  (expected {row['expected']})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="runs per scenario (default 20)")
    parser.add_argument(
        "--scenarios",
        default=",".join(builtin_scenarios()),
        help="comma-separated names from samples/scenarios/ (default: all)",
    )
    parser.add_argument("--no-load", action="store_true", help="run without the busy loops")
    args = parser.parse_args()
    names = [n.strip() for n in args.scenarios.split(",") if n.strip()]
    unknown = sorted(set(names) - set(builtin_scenarios()))
    if unknown or args.runs < 1:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}" if unknown else "--runs >= 1")
    cores = 0 if args.no_load else os.cpu_count() or 1
    # Ctrl-C and SIGTERM (a background job ignores SIGINT) both end in the finally below.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    load = start_load(cores)
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="scenario-rates-") as tmp:
            for name in names:
                rows.append(measure(name, args.runs, Path(tmp)))
    finally:
        stop_load(load)
    print(
        f"under load: {cores} busy-loop process(es) on {os.cpu_count()} core(s); "
        f"{args.runs} runs per scenario, each scenario's own seed"
    )
    print(f"{'scenario':<14} {'--check':<5} {'95% Wilson':<12}  median  outcomes seen")
    for row in rows:
        print(render(row))


if __name__ == "__main__":
    main()
