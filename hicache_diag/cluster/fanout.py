"""Run the collector on every node at once through an executor, one per-node timeout; kill
every launcher we started (its whole process group) on timeout, error or Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass

from hicache_diag.cluster.base import (
    COLLECTOR,
    Executor,
    Node,
    NodeResult,
    Sampling,
    collector_args,
)


class _Launches:
    """Every launcher process started, so one Ctrl-C can end them all."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []
        self.lock = threading.Lock()

    def start(self, argv: list[str]) -> subprocess.Popen:
        with self.lock:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # its own group: killpg reaches ssh/srun and children
            )
            self.procs.append(proc)
            return proc

    def kill_all(self) -> None:
        with self.lock:
            for proc in self.procs:
                _kill_group(proc)


def _kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=1.0)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def _close(stream) -> None:
    try:
        stream.close()
    except OSError:
        pass


def _parse(stdout: bytes) -> dict | None:
    for line in reversed(stdout.decode(errors="replace").splitlines()):
        if line.startswith("{"):
            try:
                doc = json.loads(line)
            except ValueError:
                return None
            return doc if isinstance(doc, dict) else None
    return None


@dataclass(frozen=True, slots=True)
class _Job:
    executor: Executor
    sampling: Sampling
    timeout: float
    launches: _Launches
    source: bytes  # collector.py, sent through the launcher's stdin


def _one(job: _Job, node: Node) -> NodeResult:
    executor, timeout = job.executor, job.timeout
    t0 = time.monotonic()
    result = NodeResult(node)
    remote = collector_args(node, job.sampling, len(job.source))
    try:
        proc = job.launches.start(executor.argv(node, remote))
    except OSError as exc:
        result.error = f"{executor.name}: cannot start the launcher ({exc.strerror or exc})"
        return result
    stdin, proc.stdin = proc.stdin, None  # kept open: its end tells the collector to stop
    try:
        stdin.write(job.source)
        stdin.flush()
        out, err = proc.communicate(timeout=timeout)
    except BrokenPipeError:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        result.error = f"no answer within {timeout:g} s (host hangs or is unreachable)"
        result.elapsed_s = time.monotonic() - t0
        return result
    finally:
        _close(stdin)
    result.returncode, result.stderr = proc.returncode, err.decode(errors="replace")
    result.elapsed_s = time.monotonic() - t0
    result.doc = _parse(out)
    if result.doc is None:
        result.error = executor.explain(node, proc.returncode, result.stderr)
    elif "error" in result.doc:
        result.error = f"collector failed: {result.doc['error']}"
    return result


def fan_out(executor: Executor, nodes: list[Node], s: Sampling, timeout: float) -> list[NodeResult]:
    """Every node's result, in `nodes` order, all in by `timeout` seconds after the start."""
    launches = _Launches()
    job = _Job(executor, s, timeout, launches, COLLECTOR.read_bytes())
    results: dict[int, NodeResult] = {}

    def run(i: int, node: Node) -> None:
        results[i] = _one(job, node)

    threads = [threading.Thread(target=run, args=(i, n), daemon=True) for i, n in enumerate(nodes)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        launches.kill_all()  # nothing outlives the command (Ctrl-C lands here too)
    return [results[i] for i in range(len(nodes))]
