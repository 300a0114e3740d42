"""One `--engine sglang` trial: the real server under the same harness and classifier (DESIGN §8).

run dir -> plugin config -> launch -> ready -> workload over HTTP while watching the schedulers
(a scheduler that dies is the first failure: the survivors get a grace to log their cascade; no
step and no completed request for `hang_timeout` with requests outstanding is a hang: py-spy
dumps every scheduler) -> reap the whole tree -> per-rank logs from SGLang's log prefixes ->
reference -> the same classifier as the builtin engine -> verdict.json last.
"""

from __future__ import annotations

import json
import platform
import re
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from hicache_diag import __version__
from hicache_diag.harness.rundir import prepare_run_dir, utc_now, write_json
from hicache_diag.harness.trial import TrialResult, _classify
from hicache_diag.harness.workload import Workload
from hicache_diag.sglang.client import WorkloadClient
from hicache_diag.sglang.config import REQUEST_TIMEOUT_S, SglangRunConfig
from hicache_diag.sglang.server import SglangServer
from hicache_diag.sglang_plugin.config import PluginConfig
from hicache_diag.verdict import write_json_atomic

POLL_S = 0.2
CASCADE_GRACE_S = 3.0  # SGLang's survivors log `Connection closed by peer` within a second or two
STACK_DEADLINE_S = 8.0
# `[2026-12-01 02:46:52 PP1 TP0]`: SGLang's per-rank log prefix (tokens in any order).
_PREFIX_RE = re.compile(r"^\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?P<tokens>(?: [A-Z_]+\d+)+)\]")
_TOKEN_RE = re.compile(r"(PP|TP)(\d+)")
_CHILD_EXIT_RE = re.compile(
    r"Subprocess scheduler_\d+ \(pid=(\d+)\) crashed with exit code (-?\d+)"
)

Progress = Callable[[dict[str, Any]], None]


@dataclass
class _Watch:
    first_failure: dict[str, Any] | None = None
    hang: dict[str, Any] | None = None
    stacks: dict[str, Any] | None = None
    interrupted: bool = False
    timings: dict[str, float] = field(default_factory=dict)


class _Progress:
    """Tails every rank's jsonl: the last busy (non-idle) step of each rank and when it came."""

    def __init__(self, run_dir: Path, world_size: int) -> None:
        self.files = {r: run_dir / f"rank{r}.jsonl" for r in range(world_size)}
        self.offsets = dict.fromkeys(self.files, 0)
        self.last_step: dict[int, int] = {}
        self.last_busy = time.time()

    def poll(self) -> None:
        for rank, path in self.files.items():
            try:
                with open(path, "rb") as fh:
                    fh.seek(self.offsets[rank])
                    data = fh.read()
            except FileNotFoundError:
                continue
            end = data.rfind(b"\n") + 1
            self.offsets[rank] += end
            for raw in data[:end].splitlines():
                try:
                    line = json.loads(raw)
                except ValueError:
                    continue
                if not line.get("idle"):
                    self.last_busy = time.time()
                    self.last_step[rank] = int(line.get("step", 0))


def _manifest(run_dir: Path, cfg: SglangRunConfig, argv: list[str], launch: list[str]) -> None:
    write_json(
        run_dir / "manifest.json",
        {
            "tool": "hicache-diag",
            "version": __version__,
            "engine": "sglang",
            "sglang": {"version": cfg.sglang_version, "python": cfg.python, "argv": launch},
            "python": platform.python_version(),
            "host": socket.gethostname(),
            "argv": argv or sys.argv,
            "seed": cfg.seed,
            "config": {
                "spec": {
                    k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg.spec).items()
                },
                "workload": asdict(cfg.workload),
                "hang_timeout": cfg.hang_timeout,
            },  # fmt: skip
            "protocol": None,  # SGLang's protocol is whatever its release contains (DESIGN §8)
            "faults": list(cfg.faults),
            "topology": cfg.topology(),
            "started_at": utc_now(),
        },
    )


def run_sglang_trial(
    cfg: SglangRunConfig, argv: list[str] | None = None, on_progress: Progress | None = None
) -> TrialResult:
    run_dir = prepare_run_dir(cfg.out, cfg.seed)
    if cfg.spec.hicache_storage_backend and not cfg.spec.hicache_storage_dir:
        l3 = run_dir / "l3"  # SGLang's default (/tmp/hicache) would mix unrelated runs
        cfg = replace(cfg, spec=replace(cfg.spec, hicache_storage_dir=str(l3)))
    from hicache_diag.sglang.install import SglangInstall

    package_dir = Path(cfg.package_dir or ".")
    install = SglangInstall(cfg.python, cfg.sglang_version, package_dir, None, cfg.cpu_kernel_names)
    server = SglangServer(install, cfg.spec, run_dir)
    _manifest(run_dir, cfg, argv or [], cfg.spec.argv(cfg.python, server.port))
    plugin_path = run_dir / "plugin.json"
    PluginConfig(str(run_dir), cfg.seed, cfg.faults, cfg.spec.cpu, cfg.cpu_kernel_names).write(
        str(plugin_path)
    )
    requests = Workload(cfg.workload, cfg.workload_server_args()).requests
    watch, started, t0 = _Watch(), utc_now(), time.time()
    client = None
    try:
        server.start(plugin_path)
        watch.timings["startup_s"] = round(server.wait_ready(), 3)
        client = WorkloadClient(server.url, requests, cfg.spec.pp_size, REQUEST_TIMEOUT_S)
        t_work = time.time()
        client.start()
        _watch_loop(server, client, cfg, run_dir, watch, on_progress)
        if client.result.done and watch.first_failure is None and watch.hang is None:
            for s in server.schedulers:
                if s.state == "running":
                    s.state = "finished"  # alive and stepping when the workload was done
            done = len(client.result.outputs)
            watch.timings["workload_s"] = round(time.time() - t_work, 3)
            watch.timings["per_request_s"] = round(watch.timings["workload_s"] / max(1, done), 4)
    except KeyboardInterrupt:
        watch.interrupted = True
        raise
    finally:
        if client is not None:
            client.stop()
        server.poll()
        watch.timings["shutdown_s"] = round(server.close(), 3)
        _finish_evidence(run_dir, server, client, watch, started)
    write_json(run_dir / "reference.json", _reference(cfg, requests))
    verdict = _classify(run_dir)
    verdict.duration_s = round(time.time() - t0, 3)
    verdict.run_dir = str(run_dir)
    write_json_atomic(run_dir / "verdict.json", verdict.to_json())
    return TrialResult(verdict, run_dir)


def _reference(cfg: SglangRunConfig, requests: list[Any]) -> dict[str, Any]:
    from hicache_diag.sglang.reference import compute_reference

    return compute_reference(cfg.spec.model, requests)


def _watch_loop(server: SglangServer, client: WorkloadClient, cfg: SglangRunConfig,
                run_dir: Path, watch: _Watch, on_progress: Progress | None) -> None:  # fmt: skip
    progress = _Progress(run_dir, cfg.world_size)
    grace_until = None
    while client.outstanding:
        time.sleep(POLL_S)
        now = time.time()
        for s in server.poll():
            if watch.first_failure is None:
                watch.first_failure = {"rank": s.rank, "t": s.ended_at, "pid": s.pid}
                grace_until = now + CASCADE_GRACE_S
        if watch.first_failure is None and not server.alive():
            watch.first_failure = {"rank": None, "t": now, "pid": server.popen.pid}
            grace_until = now
        progress.poll()
        if on_progress is not None:
            ranks = {
                r: {"step": st, "idle_s": now - progress.last_busy}
                for r, st in progress.last_step.items()
            }
            on_progress({"ranks": ranks, "elapsed_s": now - server.started_at})
        if grace_until is not None:
            if now > grace_until:
                return
            continue
        quiet = now - max(progress.last_busy, client.result.completed_at)
        if quiet > cfg.hang_timeout:
            _handle_hang(server, run_dir, watch, progress, now)
            return


def _handle_hang(server: SglangServer, run_dir: Path, watch: _Watch, progress: _Progress,
                 now: float) -> None:  # fmt: skip
    watch.hang = {
        "detected_at": now,
        "last_progress": {str(r): s for r, s in progress.last_step.items()},
        "stalled_ranks": [s.rank for s in server.schedulers if s.state in ("running", "stopped")],
    }
    watch.stacks = _dump_schedulers(server, run_dir)


def _dump_schedulers(server: SglangServer, run_dir: Path) -> dict[str, Any]:
    """py-spy every `sglang::scheduler*` process at once, under one deadline."""
    from hicache_diag.triage.pyspy import dump_stacks

    alive = [s for s in server.schedulers if s.state in ("running", "stopped")]
    try:
        results = dump_stacks([s.pid for s in alive], deadline_s=STACK_DEADLINE_S)
    except Exception as exc:  # noqa: BLE001 - a failed dump is evidence, not a crash
        return {"tool": "py-spy", "error": f"{type(exc).__name__}: {exc}"}
    errors = []
    for s in alive:
        res = results.get(s.pid)
        if res is not None and res.threads is not None:
            write_json(run_dir / "stacks" / f"rank{s.rank}.json", res.threads)
        else:
            errors.append(f"rank{s.rank}: {res.error if res else 'no dump'}")
    return {"tool": "py-spy", "error": "; ".join(errors) or None}


def _finish_evidence(run_dir: Path, server: SglangServer, client: WorkloadClient | None,
                     watch: _Watch, started: str) -> None:  # fmt: skip
    split_rank_logs(run_dir / "server.log", run_dir, server.spec.tp_size)
    _apply_logged_exit_codes(run_dir / "server.log", server)
    if client is not None:
        write_json(run_dir / "outputs.json", client.result.outputs)
        write_json(run_dir / "requests.json", {"cached": client.result.cached,
                                               "errors": client.result.errors,
                                               "latency_s": client.result.latency_s})  # fmt: skip
    write_json(
        run_dir / "launcher.json",
        {
            "engine": "sglang",
            "ranks": [s.to_json() for s in server.schedulers],
            "first_failure": watch.first_failure,
            "hang": watch.hang,
            "stacks": watch.stacks or {"tool": None, "error": None},
            "interrupted": watch.interrupted,
            "timings": watch.timings,
            "started_at": started,
            "ended_at": utc_now(),
        },
    )


def _apply_logged_exit_codes(log: Path, server: SglangServer) -> None:
    """SGLang's launcher logs each scheduler's exit code; ours only sees a vanished pid."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return
    codes = {int(pid): int(code) for pid, code in _CHILD_EXIT_RE.findall(text)}
    for s in server.schedulers:
        if s.pid in codes and s.state in ("crashed", "exited"):
            s.exitcode = codes[s.pid]


def split_rank_logs(server_log: Path, run_dir: Path, tp_size: int) -> dict[int, Path]:
    """rank{r}.log from SGLang's `[ts PP1 TP0]` prefixes; unprefixed lines (traceback bodies)
    stay with the rank whose line came before them."""
    try:
        lines = server_log.read_text(errors="replace").splitlines(keepends=True)
    except OSError:
        return {}
    by_rank: dict[int, list[str]] = {}
    current: int | None = None
    for line in lines:
        m = _PREFIX_RE.match(line)
        if m:
            tokens = dict(_TOKEN_RE.findall(m.group("tokens")))
            current = int(tokens.get("PP", 0)) * tp_size + int(tokens.get("TP", 0))
        elif line.startswith("["):
            current = None  # the launcher's own lines
        if current is not None:
            by_rank.setdefault(current, []).append(line)
    paths = {}
    for rank, rank_lines in by_rank.items():
        paths[rank] = run_dir / f"rank{rank}.log"
        paths[rank].write_text("".join(rank_lines))
    return paths
