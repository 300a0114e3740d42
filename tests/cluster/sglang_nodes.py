"""Real SGLang PP2 across two sshd "nodes" (tests/cluster/sshd.py), launched by hand with
SGLang's own multi-node flags: `--nnodes 2 --node-rank i --dist-init-addr 127.0.0.1:PORT`, each
node's server inside that node's namespaces. The launch spec, plugin and CPU switches are the
ones `run --engine sglang` uses (engines/sglang/build.py, trial.py). 40-90 s to start."""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import psutil

from tests.cluster.sshd import SshCluster, _free_port


def launch(cluster: SshCluster, root: Path) -> list[subprocess.Popen]:
    from hicache_diag.engines.sglang.build import build
    from hicache_diag.engines.sglang.options import SglangOptions
    from hicache_diag.engines.sglang.trial import SglangEngine

    cfg = build(SglangOptions(out=str(root / "runs")))
    addr = f"127.0.0.1:{_free_port('127.0.0.1')}"
    procs = []
    for i, node in enumerate(cluster.nodes[:2]):
        flags = ("--nnodes", "2", "--node-rank", str(i), "--dist-init-addr", addr)
        spec = replace(cfg.spec, extra_args=cfg.spec.extra_args + flags)
        trial = SglangEngine(replace(cfg, spec=spec))
        run_dir = root / f"node-{i + 1}"
        run_dir.mkdir(parents=True, exist_ok=True)
        trial.prepare(run_dir)
        env = trial.server.env(trial.plugin_path)
        env["SGLANG_CPU_OMP_THREADS_BIND"] = str(i % max(1, os.cpu_count() or 1))
        argv = spec.argv(cfg.python, _free_port("127.0.0.1"))
        cmd = ["nsenter", "--target", str(node.init_pid()), "--pid", "--mount", *argv]
        with open(run_dir / "server.log", "wb") as log:
            kw = {"stdout": log, "stderr": subprocess.STDOUT, "stdin": subprocess.DEVNULL}
            procs.append(subprocess.Popen(cmd, env=env, cwd=run_dir, **kw))
        node.started.append(procs[-1])
    return procs


def schedulers(cluster: SshCluster, procs: list, timeout: float = 300.0) -> dict[int, int]:
    """pp -> host pid of each node's `sglang::scheduler_PP{p}` (under its nsenter) once both
    are up and the first node's server logs that it is fired up."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = {}
        for launcher in procs:
            for p in psutil.Process(launcher.pid).children(recursive=True):
                try:
                    title = p.cmdline()[0] if p.cmdline() else ""
                except psutil.Error:
                    continue
                if title.startswith("sglang::scheduler_PP"):
                    found[int(title.split("_PP")[1][0])] = p.pid
        log = cluster.root / "sglang" / "node-1" / "server.log"
        up = log.is_file() and b"fired up" in log.read_bytes()
        if len(found) == 2 and up:
            return found
        time.sleep(1.0)
    raise RuntimeError(f"SGLang did not come up on both nodes in {timeout:.0f} s: {found}")
