"""`triage` on a live REAL SGLang server (PP2 + HiCache on CPU): healthy, then one scheduler
stopped (SIGSTOP), as a user on call would meet it. Read-only towards the targets, so the test
itself resumes and reaps the server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.e2e.test_sglang_engine import _missing, assert_no_sglang_left

pytestmark = pytest.mark.skipif(bool(_missing), reason=_missing or "")
CLI = [sys.executable, "-m", "hicache_diag.cli.main", "triage", "--json"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from hicache_diag.engines.sglang.model import default_model_dir
    from hicache_diag.engines.sglang.plugin.config import PluginConfig
    from hicache_diag.engines.sglang.release import preflight, probe_sglang
    from hicache_diag.engines.sglang.server import LaunchSpec, SglangServer

    run_dir = tmp_path_factory.mktemp("live")
    install = preflight(probe_sglang(), cpu=True)
    plugin = run_dir / "plugin.json"
    PluginConfig(str(run_dir), cpu_kernel_names=install.cpu_kernel_names).write(str(plugin))
    srv = SglangServer(
        install,
        LaunchSpec(
            model=default_model_dir(install.python, install.transformers), max_total_tokens=256
        ),
        run_dir,
    )
    try:
        srv.start(plugin)
        srv.wait_ready(timeout_s=600)  # a loaded shared machine starts slowly
        yield srv
    finally:
        srv.close()  # continues a stopped scheduler, then kills the tree
        assert_no_sglang_left(run_dir)


def _triage(*args: str) -> dict:
    proc = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, 12, 3), proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_live_triage_lists_both_real_schedulers_with_their_roles(server):
    # --pid, not --discover: another server on this machine (a parallel test run) would join in.
    report = _triage(*[arg for s in server.schedulers for arg in ("--pid", str(s.pid))])
    ours = [r for r in report["ranks"] if r["pid"] in {s.pid for s in server.schedulers}]
    assert sorted((r["pp"], r["title"]) for r in ours) == [
        (0, "sglang::scheduler_PP0"),
        (1, "sglang::scheduler_PP1"),
    ]
    assert all(r["role"] for r in ours)
    assert report["kind"] in ("busy", "healthy"), report["evidence"]


def test_live_triage_of_a_busy_server_names_no_culprit(server):
    # Requests in flight from three clients while triage samples the schedulers and reads the
    # server's log: progress, not a hang, and nobody to blame. Bounded: 60 requests a client.
    from hicache_diag.engines.sglang.client import generate_one

    done: list[str] = []
    stop = threading.Event()

    def client(c: int) -> None:
        for n in range(60):
            if stop.is_set():
                return
            ids = [1 + (c * 7 + n + k) % 90 for k in range(24)]
            generate_one(server.url, f"busy-{c}-{n}", ids, 24, 120)
            done.append(f"{c}-{n}")

    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(3)]
    for t in threads:
        t.start()
    try:
        deadline = time.time() + 120
        while len(done) < 3 and time.time() < deadline:
            time.sleep(0.2)
        assert len(done) >= 3, "the server answered no requests"
        # --discover within this server's tree (a parallel test run's server stays out).
        report = _triage(
            "--discover", "--parent", str(server.popen.pid), "--logs", str(server.log_path)
        )
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=180)
    assert report["kind"] in ("busy", "healthy"), report["evidence"]
    assert report["culprit"] is None, report["evidence"]
    assert {r["pid"] for r in report["ranks"]} >= {s.pid for s in server.schedulers}


def test_a_stopped_scheduler_is_the_hang_culprit(server):
    pp1 = next(s for s in server.schedulers if s.pp == 1)
    os.kill(pp1.pid, signal.SIGSTOP)
    try:
        time.sleep(2.0)  # PP0 now waits on PP1 for the next slot's request list
        pids = [arg for s in server.schedulers for arg in ("--pid", str(s.pid))]
        report = _triage(*pids)
    finally:
        os.kill(pp1.pid, signal.SIGCONT)
    assert report["kind"] == "hang", report["evidence"]
    assert report["culprit"] and report["culprit"]["pp"] == 1, report["evidence"]
    stopped = next(r for r in report["ranks"] if r["pp"] == 1)
    assert stopped["pid"] == pp1.pid


@pytest.mark.slow
def test_sglang_watchdog_on_the_waiter_names_the_stalled_rank(tmp_path):
    """SGLang's own watchdog fires in PP0 (it waits on PP1's pp_sync recv) while PP1's
    scheduler thread sleeps: run verdict and offline triage of the log both blame PP1."""
    out = tmp_path / "wd"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "hicache_diag.cli.main",
            "run",
            "--engine",
            "sglang",
            "--json",
            "--out",
            str(out),
            "--requests",
            "200",
            "--hang-timeout",
            "120",
            "--fault",
            "rank-stall:rank=1,ms=60000,p=0.01",
            "--sglang-arg=--watchdog-timeout=10",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    verdict = json.loads(run.stdout)
    assert (verdict["outcome"], verdict["form"], verdict["culprit_rank"]) == ("hang", "C", 1)
    assert "Scheduler watchdog timeout" in (out / "server.log").read_text()
    report = _triage("--logs", str(out / "server.log"))
    assert (report["kind"], report["culprit"]["pp"]) == ("hang", 1), report["evidence"]
    assert_no_sglang_left(out)
