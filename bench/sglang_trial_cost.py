"""Where one real-engine trial's time goes, phase by phase (issue: trials in seconds).

Each trial is a fresh `hicache-diag run --engine sglang --json` CLI process. The phases come from
the run dir's own clocks: the manifest's `started_at` (checks done, launch begins), SGLang's
server.log (`Load weight begin/end`, second resolution), launcher.json (`startup_s`: launch to
ready; `workload_s`; `shutdown_s`; `ended_at`) and verdict.json's write time. Printed as a table
per trial and the median; never asserts on time.

Then the same workload on a warm server (sglang/warm.py, `--warm-server`), in this process: one
trial starts the server (and takes the fresh clean-state proof), the next runs on it once every
rank proved it clean. W is that trial's wall time from "trial starts" to its verdict; F is the
fresh trial's CLI start to exit. Ends with the one line `fresh trial F s, warm trial W s`
(W `n/a`, with why, when the proof did not pass).
Usage: python bench/sglang_trial_cost.py [--trials 1] [--sglang-python PY] [-- run flags]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

CLI = [sys.executable, "-m", "hicache_diag.cli.main", "run", "--engine", "sglang", "--json"]
PHASES = (
    ("checks", "CLI start -> launch: flags, release probe, tiny model, plugin bundle"),
    ("server_imports", "launch -> first `Load weight begin`: interpreters, imports, dist init"),
    ("model_load", "`Load weight begin` -> last `Load weight end`"),
    ("kv_and_ready", "weights loaded -> /health_generate answers (KV pools, HTTP server)"),
    ("requests", "the workload over HTTP (our plugin records each step meanwhile)"),
    ("teardown", "reaping SGLang's process tree"),
    ("evidence", "per-rank logs, the transformers reference for answered requests"),
    ("classification", "launcher.json -> verdict.json (reading the run dir, judging)"),
)
_LOG_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)[^\]]*\] Load weight (begin|end)")


def _ts(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def _weights(log: Path) -> tuple[float | None, float | None]:
    """(first `Load weight begin`, last `Load weight end`) as epoch seconds (UTC log stamps)."""
    begins, ends = [], []
    for line in log.read_text(errors="replace").splitlines():
        m = _LOG_TIME.match(line)
        if m:
            stamp = datetime.fromisoformat(m.group(1) + "+00:00").timestamp()
            (begins if m.group(2) == "begin" else ends).append(stamp)
    return (min(begins) if begins else None), (max(ends) if ends else None)


def phases(run: Path, t_cli: float, t_end: float) -> dict[str, float | None]:
    manifest = json.loads((run / "manifest.json").read_text())
    launcher = json.loads((run / "launcher.json").read_text())
    timings = launcher.get("timings", {})
    launch = _ts(manifest["started_at"])
    ready = launch + timings.get("startup_s", 0.0)
    begin, end = _weights(run / "server.log")
    work_end = ready + timings.get("workload_s", 0.0)
    ended = _ts(launcher["ended_at"])
    verdict_at = (run / "verdict.json").stat().st_mtime
    out = {
        "checks": launch - t_cli,
        "server_imports": None if begin is None else begin - launch,
        "model_load": None if begin is None or end is None else end - begin,
        "kv_and_ready": None if end is None else ready - end,
        "requests": timings.get("workload_s"),
        "teardown": timings.get("shutdown_s"),
        "evidence": ended - work_end - timings.get("shutdown_s", 0.0),
        "classification": verdict_at - ended,
        "total": t_end - t_cli,
    }
    return {k: None if v is None else round(v, 2) for k, v in out.items()}


def one_trial(out: Path, extra: list[str]) -> dict[str, float | None]:
    t_cli = time.time()
    proc = subprocess.run([*CLI, "--out", str(out), *extra], capture_output=True, text=True)
    t_end = time.time()
    if not (out / "launcher.json").is_file():
        raise SystemExit(f"the trial left no launcher.json: {proc.stderr[-2000:]}")
    row = phases(out, t_cli, t_end)
    row["outcome"] = json.loads(proc.stdout).get("outcome") if proc.stdout.strip() else None
    return row


def _warm_config(extra: list[str], out: Path):
    """The fresh trials' config, parsed by the `run` command's own parser and built."""
    from hicache_diag.cli.run import options_from_argv
    from hicache_diag.engines.registry import build

    return build(options_from_argv(["--engine", "sglang", "--out", str(out), *extra]))


def warm_trials(extra: list[str], root: Path) -> tuple[float | None, str]:
    """(the warm trial's seconds from start to verdict, what its manifest says)."""
    from hicache_diag import evidence as ev
    from hicache_diag.engines.sglang.warm import WarmSglang

    cfg = _warm_config(extra, root / "cfg")
    pool = WarmSglang(root / "warm-server")
    try:
        t0 = time.time()
        first = pool.trial(cfg.for_trial(cfg.seed, str(root / "w0")))
        print(
            f"warm pool trial 0 (starts the server): {first.verdict.outcome.value}, "
            f"{time.time() - t0:.1f} s"
        )
        t1 = time.time()
        # The same seed: the fresh trials' workload, whose transformers reference is cached.
        second = pool.trial(cfg.for_trial(cfg.seed, str(root / "w1")))
        took = time.time() - t1
    finally:
        pool.close()
    warm = ev.read_record(ev.Manifest, root / "w1" / ev.MANIFEST).warm_server
    launcher = ev.read_record(ev.LauncherRecord, root / "w1" / ev.LAUNCHER)
    said = (
        f"outcome {second.verdict.outcome.value}, reused {warm.reused} ({warm.why}), "
        f"boundary {warm.boundary_s} s, workload {launcher.timings.get('workload_s')} s, "
        f"differences {warm.differences or 'none'}"
    )
    return (took if warm.reused else None), said


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1)
    parser.add_argument("--sglang-python")
    parser.add_argument("run_args", nargs="*")
    args = parser.parse_args()
    extra = list(args.run_args) + (
        ["--sglang-python", args.sglang_python] if args.sglang_python else []
    )
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.trials):
            rows.append(one_trial(Path(tmp) / f"t{i}", extra))
            print(f"trial {i}: outcome {rows[-1]['outcome']}, {rows[-1]['total']} s")
        warm_s, warm_said = warm_trials(extra, Path(tmp) / "warm")
        print(f"warm pool trial 1 (on the warm server): {warm_said}")
    names = [f"trial {i}" for i in range(len(rows))]
    print(f"\n{'phase':16s} " + " ".join(f"{n:>9s}" for n in names) + "  what")
    for name, what in (*PHASES, ("total", "CLI start -> CLI exit")):
        cells = [f"{r[name]:9.2f}" if r.get(name) is not None else "      n/a" for r in rows]
        print(f"{name:16s} " + " ".join(cells) + f"  {what}")
    fresh = statistics.median(r["total"] for r in rows)
    # Trial 0 may compute the transformers reference; later trials of the same prompts read it
    # from the cache (sglang/reference.py).
    warm = f"{warm_s:.1f}" if warm_s is not None else "n/a"
    print(f"\nfresh trial {fresh:.1f} s, warm trial {warm} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
