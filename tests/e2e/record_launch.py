"""A server the user launches, as a user would: `python -m sglang.launch_server` with the tiny
model's CPU flags (the same flags `run --engine sglang` gives it: launch_spec.py), started as
its own process group and reaped whole on every path. Shared by the `record` e2e tests; none of
the tool's launcher is involved."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import psutil

from hicache_diag.engines.sglang.install import probe_sglang
from hicache_diag.engines.sglang.launch_spec import LaunchSpec
from hicache_diag.engines.sglang.model import default_model_dir
from hicache_diag.errors import UsageError

READY_S = float(os.environ.get("HICACHE_DIAG_SGLANG_READY_TIMEOUT") or 600)


def held_0523() -> bool:
    try:
        return probe_sglang(None).version == "0.5.23"
    except UsageError:
        return False


def server_argv(port: int, extra: tuple[str, ...] = ()) -> list[str]:
    install = probe_sglang(None)
    model = default_model_dir(install.python, install.transformers)
    return LaunchSpec(model, extra_args=extra).argv(install.python, port)


def cpu_env(base: dict[str, str] | None = None, ranks: int = 2) -> dict[str, str]:
    """What a CPU user sets for SGLang (reference/sglang-on-cpu.md), one core a rank."""
    env = {k: v for k, v in (base or os.environ).items() if not k.startswith("HICACHE_DIAG_")}
    cores = max(1, os.cpu_count() or 1)
    env["SGLANG_USE_CPU_ENGINE"] = "1"
    env["SGLANG_CPU_OMP_THREADS_BIND"] = "|".join(str(r % cores) for r in range(ranks))
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def hicache_diag(*args: str) -> list[str]:
    return [sys.executable, "-m", "hicache_diag.cli.main", *args]


@contextmanager
def launched(argv: list[str], env: dict[str, str], log: Path):
    """The server, running; killed with everything it started when the block ends."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        yield proc
    finally:
        reap(proc)


def reap(proc: subprocess.Popen) -> None:
    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    for p in tree:
        try:
            p.resume()  # a stopped scheduler takes no signal until it runs
        except psutil.Error:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    for p in tree:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(tree, timeout=15)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        pass


def wait_ready(proc: subprocess.Popen, port: int, log: Path) -> None:
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited ({proc.returncode}): {tail(log)}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(1)
    raise AssertionError(f"not ready after {READY_S:.0f} s: {tail(log)}")


def generate(port: int, text: str, tokens: int = 8) -> dict:
    body = {"text": text, "sampling_params": {"max_new_tokens": tokens, "temperature": 0}}
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/generate",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())


def schedulers(proc: subprocess.Popen) -> dict[int, int]:
    """pp rank -> pid of each `sglang::scheduler_PP{r}` the server runs."""
    out = {}
    for p in psutil.Process(proc.pid).children(recursive=True):
        try:
            title = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if title.startswith("sglang::scheduler"):
            rank = title.split("_PP", 1)[1][:1] if "_PP" in title else "0"
            out[int(rank)] = p.pid
    return out


def until(check, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"{what}: not within {timeout_s:.0f} s")


def tail(log: Path, n: int = 3000) -> str:
    try:
        return log.read_text(errors="replace")[-n:]
    except OSError:
        return "(no log)"
