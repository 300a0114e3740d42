"""Two checkouts' log readers over the same logs: the full evidence each reads (every field of
logs.model.LogEvidence) and the triage verdict, compared log by log. A change to the reader's
fast path is checked against the code it replaces this way (the unit tests compare the fast
path with the full one inside one checkout).

Run from the project root:
  python bench/reader_equivalence.py --reference /path/to/other/checkout [--lines 300000]
Writes generated logs (a busy server's lines plain, behind a runner's tag, two servers' logs
interleaved line by line, hard-wrapped at 120 columns, gzip'd, with triggers, HiCache lines,
tracebacks, carriers and a long silence here and there) and reads them, with every log under
samples/, in this checkout and in the reference one; prints one line per log and a count of
the logs that differ (exit 0: figures, not a test).
"""

from __future__ import annotations

import sys

sys.path[:] = [p for p in sys.path if not p.rstrip("/").endswith("bench")]

import argparse  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import textwrap  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
_CHILD = """
import dataclasses, json, sys
from pathlib import Path
from hicache_diag.logs.files import parse_log_file
from hicache_diag.triage import TriageRequest, run_triage
out = {}
for name in sys.argv[1:]:
    path = Path(name)
    try:
        ev = parse_log_file(path)
        fields = {f.name: repr(getattr(ev, f.name)) for f in dataclasses.fields(ev)}
        report = run_triage(TriageRequest(logs=(path,)))
        out[name] = [fields, report.kind, report.form, repr(report.culprit)]
    except Exception as exc:  # a refusal is compared too
        out[name] = [type(exc).__name__, str(exc)]
print(json.dumps(out))
"""


def _server_line(n: int, base: int = 0) -> str:
    s = (base + n) % 60
    rank = f"PP{n % 2} TP{n // 2 % 2}"
    ts = f"2026-06-24 15:{(base + n) // 60 % 60:02d}:{s:02d}"
    return [
        f"[{ts} {rank}] Decode batch, #running-req: 32, #token: 9{n % 9999:04d}, token usage: "
        f"0.41, cuda graph: True, gen throughput (token/s): 18{n % 97}.22, #queue-req: 3",
        f"[{ts} {rank}] Prefill batch, #new-seq: 2, #new-token: 512, #cached-token: {n}, "
        "token usage: 0.40, #running-req: 30, #queue-req: 1",
        f'[{ts}] INFO:     10.0.0.7:{n} - "POST /v1/chat/completions HTTP/1.1" {200 + n % 3 * 150}'
        " OK",
        f"[{ts} {rank}] WARNING: Prefetch reservation reached the cap (prefetch_tokens_occupied="
        f"{n}); L3 prefetch paused",
        f"[{ts} {rank}] ",
        f"[{ts}] The server is fired up and ready to roll!",
    ][n % 7 % 6]


_EXTRAS = {
    997: ["[2026-06-24 15:38:00 PP0 TP0] HiCache storage backend file ready"],
    1499: ["[2026-06-24 15:38:00 PP1 TP0] NCCL INFO comm 0x1 rank 0 nranks 2 - Init COMPLETE"],
    2003: [
        "[2026-06-24 15:38:00 TP1] Ignore import error when loading sglang.x: no module",
        "Traceback (most recent call last):",
        '  File "x.py", line 1, in f',
        "ImportError: no",
    ],
    2711: ["2026-06-24T15:38:00.000000001Z stdout F [2026-06-24 15:38:00 TP0] Decode batch, x"],
    4001: ["[2026-06-24 23:59:00 PP0 TP0] Decode batch, #running-req: 1 (after a silence)"],
}
_CRASH = [
    "[2026-06-25 00:00:00 PP1 TP0] Scheduler hit an exception: Traceback (most recent call last):",
    '  File "/sgl/python/sglang/srt/mem_cache/hiradix_cache.py", line 301, in writing_check',
    "    self.ack_write_queue.pop(0)",
    "IndexError: pop from empty list",
]


def busy(n: int, base: int = 0) -> list[str]:
    out = []
    for k in range(n):
        out.append(_server_line(k, base))
        for every, extra in _EXTRAS.items():
            if k % every == every - 1:
                out += extra
    return out + _CRASH


def write_logs(tmp: Path, n: int) -> list[Path]:
    lines = busy(n)
    logs = {
        "plain.log": lines,
        "tagged.log": [f"gpu-node-3.cluster [stderr] {k:07d} {s}" for k, s in enumerate(lines)],
        "interleaved.log": [x for pair in zip(lines, busy(n, 17), strict=True) for x in pair],
        "wrapped.log": [p for s in lines for p in (textwrap.wrap(s, 120) or [""])],
    }
    paths = []
    for name, body in logs.items():
        path = tmp / name
        path.write_text("".join(s + "\n" for s in body))
        paths.append(path)
    gz = tmp / "plain.log.gz"
    gz.write_bytes(gzip.compress((tmp / "plain.log").read_bytes(), 1))
    return [*paths, gz]


def read_all(checkout: Path, logs: list[Path]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, *map(str, logs)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=checkout,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--reference", required=True, type=Path, help="the other checkout's root")
    ap.add_argument("--lines", type=int, default=300_000, help="lines per generated log")
    args = ap.parse_args()
    samples = sorted(
        p for p in (ROOT / "samples").rglob("*") if p.suffix in (".log", ".txt", ".gz")
    )
    with tempfile.TemporaryDirectory() as tmp:
        made = write_logs(Path(tmp), args.lines)
        logs = made + samples
        here, there = read_all(ROOT, logs), read_all(args.reference.resolve(), logs)
    differ = 0
    for log in logs:
        same = here[str(log)] == there[str(log)]
        differ += not same
        if not same or log in made:
            verdict = here[str(log)][1:3] if len(here[str(log)]) > 2 else here[str(log)]
            print(f"{'same' if same else 'DIFFERENT':>9}  {log.name}  {verdict}")
    print(f"{len(logs)} logs read by both checkouts: {differ} differ")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
