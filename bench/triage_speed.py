"""Offline triage speed and memory on big logs: lines/s and peak RSS.

Run from the project root:  python bench/triage_speed.py [--sizes 10000,100000,1000000]
Writes synthetic SGLang server logs (PP2 x TP2 decode and prefill lines, HTTP access lines,
benign warnings, a form-B crash with its cascade at the end) of each size, plus one 20 MB
single line, and triages each as `hicache-diag triage --logs` does, in a fresh interpreter per
log so its peak RSS is that read's alone. Prints one row per log; exits 0 (figures, not a test).
Goal (issue 21): 1M lines <= 5 s and <= 200 MB RSS; the 20 MB line <= 5 s.
"""

from __future__ import annotations

import sys

# `python bench/x.py` puts bench/ first on sys.path, where bench/bisect.py would shadow the
# standard library's bisect: drop it before anything else.
sys.path[:] = [p for p in sys.path if not p.rstrip("/").endswith("bench")]

import argparse  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

_LINES = (
    "[2026-06-24 15:38:{s:02d} PP{pp} TP{tp}] Decode batch, #running-req: 32, #token: 9{n:04d}, "
    "token usage: 0.41, cuda graph: True, gen throughput (token/s): 1843.22, #queue-req: 3",
    "[2026-06-24 15:38:{s:02d} PP{pp} TP{tp}] Prefill batch, #new-seq: 2, #new-token: 512, "
    "#cached-token: {n}, token usage: 0.40, #running-req: 30, #queue-req: 1",
    '[2026-06-24 15:38:{s:02d}] INFO:     10.0.0.7:{n} - "POST /v1/chat/completions HTTP/1.1" '
    "200 OK",
    "[2026-06-24 15:38:{s:02d} PP{pp} TP{tp}] WARNING: Prefetch reservation reached the cap "
    "(prefetch_tokens_occupied={n}); L3 prefetch paused",
)
_CRASH = """\
[2026-06-24 15:39:00 PP1 TP0] Scheduler hit an exception: Traceback (most recent call last):
  File "/sgl/python/sglang/srt/managers/scheduler.py", line 2710, in run_scheduler_process
    scheduler.event_loop_pp()
  File "/sgl/python/sglang/srt/mem_cache/hiradix_cache.py", line 301, in writing_check
    self.ack_write_queue.pop(0)
IndexError: pop from empty list
[2026-06-24 15:39:00 PP0 TP0] Scheduler hit an exception: Traceback (most recent call last):
  File "/sgl/python/sglang/srt/distributed/parallel_state.py", line 812, in recv_object
    work.wait()
RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer
"""

_CHILD = """
import json, resource, sys, time
from pathlib import Path
from hicache_diag.triage import TriageRequest, run_triage
t0, c0 = time.perf_counter(), time.process_time()
report = run_triage(TriageRequest(logs=(Path(sys.argv[1]),)))
elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"s": elapsed, "cpu": cpu, "rss_mb": rss, "kind": report.kind,
                  "form": report.form}))
"""


def write_log(path: Path, lines: int) -> None:
    with path.open("w") as f:
        for n in range(lines - 10):
            tpl = _LINES[n % 7 % len(_LINES)]
            f.write(tpl.format(s=n % 60, pp=n % 2, tp=(n // 2) % 2, n=n) + "\n")
        f.write(_CRASH)


def write_single_line(path: Path, megabytes: int) -> None:
    # One line of letters, words and brackets (the shapes that make backtracking regexes
    # quadratic), as a base64 blob or a runaway repr would make it.
    unit = "a" * 4000 + " Error [x] " + "B" * 4000 + ' File "x Traceback ' + "1." * 500
    with path.open("w") as f:
        f.write((unit * (megabytes * 2**20 // len(unit) + 1))[: megabytes * 2**20] + "\n")


def measure(path: Path) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path)], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--sizes", default="10000,100000,1000000", help="log sizes in lines")
    ap.add_argument("--line-mb", type=int, default=20, help="size of the single-line log")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    # Wall time counts the machine's other load; CPU time is this process's own work.
    print(
        f"{'log':>22} {'MB':>7} {'wall s':>8} {'CPU s':>7} {'lines/s CPU':>12} "
        f"{'peak RSS MB':>12}  verdict"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            path = Path(tmp) / f"server-{n}.log"
            write_log(path, n)
            r = measure(path)
            mb = path.stat().st_size / 2**20
            print(
                f"{n:>16} lines {mb:7.1f} {r['s']:8.2f} {r['cpu']:7.2f} {n / r['cpu']:12.0f} "
                f"{r['rss_mb']:12.0f}  {r['kind']} {r['form']}"
            )
            path.unlink()
        path = Path(tmp) / "one-line.log"
        write_single_line(path, args.line_mb)
        r = measure(path)
        print(
            f"{'1 line':>22} {args.line_mb:7.1f} {r['s']:8.2f} {r['cpu']:7.2f} "
            f"{1 / r['cpu']:12.2f} "
            f"{r['rss_mb']:12.0f}  {r['kind']} {r['form']}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
