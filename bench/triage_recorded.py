"""Time to a verdict of `triage` on a recorded PP2 server (issue 37's budget: <= 10 s locally,
with the first divergent step named when there is one). Wall time of the whole command, as a
user waits for it (interpreter start, py-spy or the in-process dumps, reading the recording).

    python bench/triage_recorded.py            # real SGLang 0.5.23 PP2 via `hicache-diag record`
    python bench/triage_recorded.py --fake     # two recording processes, no SGLang (seconds)

Real mode: one server, launched with the user's own command through `record`; triage of it
idle (ptrace allowed, then refused), then session-close rounds until the stages part and
triage again (live when the parting left the server up, else the recording as left). Prints
one line a measurement; never asserts on time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CLI = [sys.executable, "-m", "hicache_diag.cli.main", "triage", "--json"]
NO_PTRACE = ROOT / "tests" / "unit" / "triage" / "no_ptrace.py"


def timed(args: list[str], refuse_ptrace: bool = False) -> tuple[str, dict]:
    """(wall and CPU seconds, the JSON verdict). CPU: triage's and its children's (py-spy), a
    figure a shared, loaded machine leaves comparable where the wall time is not."""
    cmd = [*CLI, *args]
    if refuse_ptrace:
        cmd = [sys.executable, str(NO_PTRACE), *cmd]
    t0, cpu0 = time.perf_counter(), _children_cpu()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    took = f"{time.perf_counter() - t0:.2f} s wall, {_children_cpu() - cpu0:.2f} s CPU"
    try:
        return took, json.loads(proc.stdout)
    except ValueError:
        sys.exit(f"triage failed ({proc.returncode}): {proc.stderr[-800:]}")


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def say(what: str, took: str, data: dict) -> None:
    first = data.get("first_divergence")
    named = (
        f"first divergence step {first['step']} {first['field']} {first['values']} "
        f"source {first['source']}"
        if first
        else "no first divergence"
    )
    culprit = (data.get("culprit") or {}).get("label") or "-"
    print(f"{what}: {took} -> {data['kind']} culprit {culprit}; {named}", flush=True)


def fake() -> None:
    from tests.unit.triage.recorded_ranks import RecordedRanks

    with tempfile.TemporaryDirectory() as tmp, RecordedRanks(Path(tmp) / "s", (400, 400), 300) as r:
        pids = [a for pid in r.pids for a in ("--pid", str(pid))]
        say("fake PP2, ptrace allowed", *timed(pids))
        say("fake PP2, ptrace refused", *timed(pids, refuse_ptrace=True))


def real() -> None:
    import tests.e2e.test_sglang_record_triage as e2e

    install, port = e2e._install(), e2e._free_port()
    with tempfile.TemporaryDirectory() as tmp:
        record_dir = Path(tmp) / "rec"
        argv = [*e2e.CLI, "record", "--dir", str(record_dir), "--cpu-shims", "--"]
        argv += e2e._launch_line(install, port)
        with e2e.UserServer(argv, e2e._cpu_env(install), Path(tmp), port) as srv:
            t0 = time.perf_counter()
            srv.wait_ready()
            print(f"server ready in {time.perf_counter() - t0:.0f} s", flush=True)
            session = e2e._session(record_dir)
            live = ["--discover", "--parent", str(srv.proc.pid)]
            say("real PP2 idle, ptrace allowed", *timed(live))
            say("real PP2 idle, ptrace refused", *timed(live, refuse_ptrace=True))
            e2e._drive_until_parted(srv, session)
            if srv.alive():
                say("real PP2 parted, live", *timed(live))
            else:
                say(
                    "real PP2 parted and crashed, --record-dir",
                    *timed(["--record-dir", str(record_dir)]),
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fake", action="store_true", help="recording processes, no SGLang")
    args = parser.parse_args()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    fake() if args.fake else real()


if __name__ == "__main__":
    main()
