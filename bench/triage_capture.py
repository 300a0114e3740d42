"""Capture a real SGLang server's log in one state, for samples/corpus (triage's accuracy).

Run from the project root:
  python bench/triage_capture.py STATE --out DIR [--sglang-python PY]
Starts SGLang as `hicache-diag run --engine sglang` does (PP2, HiCache L2, the tiny model, on
CPU), keeps it busy with three clients of bounded requests, then makes the state's physical
event happen and copies what the server printed:
  busy-stop  DIR/busy.log: the log while serving (cut before the stop); DIR/stopped.log: the
             operator then stops it (`docker stop`: SIGTERM to the launcher, 30 s, SIGKILL)
  killed     `kill -9` of PP1's scheduler while serving (the OOM killer, an operator)
  hang-stop  PP1's scheduler is stopped (SIGSTOP: a process stuck in the kernel, a debugger),
             requests pile up for 20 s, then the operator stops the server as in busy-stop
The crash and watchdog states come from `hicache-diag run` with a fault (samples/corpus/README.md
lists the commands). Every process is reaped on every path; prints the files written.
"""

from __future__ import annotations

import sys

sys.path[:] = [p for p in sys.path if not p.rstrip("/").endswith("bench")]

import argparse  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

STATES = ("busy-stop", "killed", "hang-stop")


def _clients(url: str, stop: threading.Event, done: list[str]) -> list[threading.Thread]:
    from hicache_diag.engines.sglang.client import generate_one

    def client(c: int) -> None:
        for n in range(200):
            if stop.is_set():
                return
            ids = [1 + (c * 7 + n + k) % 90 for k in range(24)]
            try:
                generate_one(url, f"load-{c}-{n}", ids, 24, 60)
                done.append(f"{c}-{n}")
            except OSError:
                return  # the server went away (the state's event): the client stops

    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(3)]
    for t in threads:
        t.start()
    return threads


def _operator_stop(srv, grace_s: float = 30.0) -> None:
    """What `docker stop` does: SIGTERM to the launcher, then SIGKILL after the grace."""
    os.kill(srv.popen.pid, signal.SIGTERM)
    try:
        srv.popen.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.kill(srv.popen.pid, signal.SIGKILL)
    time.sleep(2.0)  # what the children print while they go


def capture(state: str, out: Path, python: str | None) -> list[Path]:
    from hicache_diag.engines.sglang.model import default_model_dir
    from hicache_diag.engines.sglang.plugin.config import PluginConfig
    from hicache_diag.engines.sglang.release import preflight, probe_sglang
    from hicache_diag.engines.sglang.server import LaunchSpec, SglangServer

    out.mkdir(parents=True, exist_ok=True)
    install = preflight(probe_sglang(python), cpu=True)
    plugin = out / "plugin.json"
    PluginConfig(str(out), cpu_kernel_names=install.cpu_kernel_names).write(str(plugin))
    model = default_model_dir(install.python, install.transformers)
    # Releases whose paged allocator needs triton run with page size 1 (launch_facts).
    page = 1 if install.launch.paged_alloc_needs_triton else 4
    spec = LaunchSpec(model=model, max_total_tokens=256, page_size=page)
    srv = SglangServer(install, spec, out)
    stop, done = threading.Event(), []
    threads: list[threading.Thread] = []
    written = []
    try:
        srv.start(plugin)
        srv.wait_ready(timeout_s=900)
        threads = _clients(srv.url, stop, done)
        deadline = time.time() + 180
        while len(done) < 30 and time.time() < deadline:
            time.sleep(0.5)
        pp1 = next(s for s in srv.schedulers if s.pp == 1)
        if state == "busy-stop":
            shutil.copy(srv.log_path, out / "busy.log")
            written.append(out / "busy.log")
            _operator_stop(srv)
        elif state == "killed":
            os.kill(pp1.pid, signal.SIGKILL)
            time.sleep(20.0)
        elif state == "hang-stop":
            os.kill(pp1.pid, signal.SIGSTOP)
            time.sleep(20.0)
            _operator_stop(srv)
        stop.set()
    finally:
        stop.set()
        srv.close()  # continues a stopped scheduler, then kills the tree
        for t in threads:
            t.join(timeout=90)
    final = out / ("stopped.log" if state != "killed" else "killed.log")
    shutil.copy(srv.log_path, final)
    print(f"{state}: {len(done)} requests answered; SGLang {install.version}")
    return [*written, final]


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("state", choices=STATES)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--sglang-python", default=None)
    args = ap.parse_args()
    for path in capture(args.state, args.out, args.sglang_python):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
