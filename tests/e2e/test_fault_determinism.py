"""Same scenario + seed = same fault firing steps, whatever the threads' timing (issue 14).

The DMA copy thread used to take a fault's step from whatever the scheduler was doing when the
copy ran, so CPU contention moved `after`/`until` windows and recorded steps. Now every DMA and
storage operation carries the step that issued it. The scenario keeps the batch schedule
timing-free (a device pool large enough that nothing is evicted or loaded back, so no decision
waits on an ack), which leaves the copy thread's timing as the only thing contention changes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import assert_no_children

CLI = [sys.executable, "-m", "hicache_diag.cli.main", "run"]
ARGS = [
    "--fault",
    "dma-delay:rank=1,ms=60,jitter-ms=20,p=0.5,after=5,until=60,dir=write",
    "--fault",
    "host-alloc-fail:rank=0,p=0.3",
    "--max-total-tokens",
    "4096",
    "--requests",
    "16",
    "--seed",
    "5",
    "--json",
]
HOG = "while True: pass"


def _fired(out: Path) -> list[tuple]:
    fired = []
    for path in sorted(out.glob("rank*.jsonl")):
        for line in path.read_text().splitlines():
            for f in json.loads(line).get("faults_fired") or []:
                fired.append(
                    (path.stem, f["fault"], f["step"], f.get("direction"), f.get("delay_ms"))
                )
    return sorted(fired, key=repr)


def _run(out: Path, hogs: int) -> list[tuple]:
    procs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(hogs)]
    try:
        proc = subprocess.run(
            [*CLI, *ARGS, "--out", str(out)], capture_output=True, text=True, timeout=240
        )
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert proc.returncode == 0, proc.stderr[-2000:]
    return _fired(out)


def test_fault_firing_steps_survive_cpu_contention(tmp_path):
    quiet = _run(tmp_path / "quiet", hogs=0)
    loaded = _run(tmp_path / "loaded", hogs=3)
    assert any(f[1] == "dma-delay" for f in quiet), f"the DMA fault never fired: {quiet}"
    assert quiet == loaded, "the same scenario and seed fired differently under CPU contention"
    assert_no_children()
