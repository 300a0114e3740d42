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
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from hicache_diag import __version__
from hicache_diag.diagnosis.tracebacks import parse_crash
from hicache_diag.harness.proc_facts import StopWatch
from hicache_diag.harness.rundir import prepare_run_dir, utc_now, write_json
from hicache_diag.harness.trial import (
    TrialResult,
    _classify,
    _pyspy_dumps,
    _restore_sigterm,
    _trap_sigterm,
)
from hicache_diag.harness.workload import Workload
from hicache_diag.rules.signatures import LAUNCHER_TEARDOWN_RE
from hicache_diag.sglang.client import WorkloadClient
from hicache_diag.sglang.config import REQUEST_TIMEOUT_S, SglangRunConfig
from hicache_diag.sglang.server import ServerStartError, SglangServer
from hicache_diag.sglang.server_log import harvest_pyspy_dumps, watchdog_firing
from hicache_diag.sglang.sessions import SESSION_WORKLOADS, make_client
from hicache_diag.sglang_plugin.config import PluginConfig
from hicache_diag.triage.discover import RankId, parse_rank_tokens
from hicache_diag.verdict import Outcome, Verdict, write_json_atomic

POLL_S = 0.2
CASCADE_GRACE_S = 3.0  # SGLang's survivors log `Connection closed by peer` within a second or two
# `[2026-12-01 02:46:52 PP1 TP0]`: SGLang's per-rank log prefix (tokens in any order).
_PREFIX_RE = re.compile(r"^\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?P<tokens>(?: [A-Z_]+\d+)+)\]")
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
    startup_error: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    stops: StopWatch = field(default_factory=StopWatch)


class _Progress:
    """Tails every rank's jsonl: the last busy (non-idle) step of each rank and when it came."""

    def __init__(self, run_dir: Path, world_size: int) -> None:
        self.files = {r: run_dir / f"rank{r}.jsonl" for r in range(world_size)}
        self.offsets = dict.fromkeys(self.files, 0)
        self.last_step: dict[int, int] = {}
        self.last_t: dict[int, float] = {}  # rank -> when its last busy step was written
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
                    self.last_t[rank] = float(line.get("t") or self.last_busy)


def _manifest(run_dir: Path, cfg: SglangRunConfig, argv: list[str], launch: list[str]) -> None:
    write_json(
        run_dir / "manifest.json",
        {
            "tool": "hicache-diag",
            "version": __version__,
            "engine": "sglang",
            "sglang": {**cfg.release, "version": cfg.sglang_version, "python": cfg.python,
                       "argv": launch, "launch_facts": cfg.launch_facts.to_json()},
            "notes": list(cfg.notes),
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
    install = SglangInstall(cfg.python, cfg.sglang_version, package_dir, None,
                            cfg.cpu_kernel_names, launch=cfg.launch_facts)  # fmt: skip
    server = SglangServer(install, cfg.spec, run_dir)
    _manifest(run_dir, cfg, argv or [], cfg.spec.argv(cfg.python, server.port))
    plugin_path = run_dir / "plugin.json"
    PluginConfig(str(run_dir), cfg.seed, cfg.faults, cfg.spec.cpu, cfg.cpu_kernel_names).write(
        str(plugin_path)
    )
    scripted = cfg.workload.workload in SESSION_WORKLOADS  # turns are added as they finish
    requests = [] if scripted else Workload(cfg.workload, cfg.workload_server_args()).requests
    watch, started, t0 = _Watch(), utc_now(), time.time()
    client = None
    old = _trap_sigterm()
    try:
        server.start(plugin_path)
        watch.timings["startup_s"] = round(server.wait_ready(
            on_phase=_phase_reporter(server, cfg, on_progress)), 3)  # fmt: skip
        client = make_client(cfg, server.url, requests, REQUEST_TIMEOUT_S)
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
    except KeyboardInterrupt:  # the verdict (outcome interrupted) is still written below
        watch.interrupted = True
    except ServerStartError as exc:  # a run that never started: undecided, with the reason
        watch.startup_error = str(exc)
    finally:
        if client is not None:
            client.stop()
        server.poll()
        try:
            watch.timings["shutdown_s"] = round(server.close(), 3)
        except KeyboardInterrupt:  # a second Ctrl-C while reaping: reap anyway
            server.close()
        _restore_sigterm(old)
        _finish_evidence(run_dir, server, client, watch, started)
    # Only requests that completed can be compared; a crash or hang leaves the rest unanswered.
    done = set(client.result.outputs) if client is not None else set()
    write_json(run_dir / "reference.json", _reference(cfg, [r for r in requests if r.rid in done]))
    verdict = _classify(run_dir)
    if watch.startup_error and not _any_step_recorded(run_dir, cfg.world_size):
        verdict = _environment_failure(verdict, watch.startup_error)
    elif watch.startup_error:  # the schedulers were serving (SGLang's readiness request)
        verdict.evidence.append(f"it ended before SGLang reported ready: {watch.startup_error}")
    verdict.evidence += [f"launch adapted: {note}" for note in cfg.notes]
    verdict.duration_s = round(time.time() - t0, 3)
    verdict.run_dir = str(run_dir)
    write_json_atomic(run_dir / "verdict.json", verdict.to_json())
    return TrialResult(verdict, run_dir)


def _phase_reporter(server: SglangServer, cfg: SglangRunConfig, on_progress: Progress | None):
    """Start-up phases as progress snapshots (the CLI shows them as one status line)."""
    if on_progress is None:
        return None

    def report(phase: str) -> None:
        on_progress({"phase": f"SGLang {cfg.sglang_version}: {phase}",
                     "elapsed_s": time.time() - server.started_at, "log": str(server.log_path)})

    return report


def _any_step_recorded(run_dir: Path, world_size: int) -> bool:
    """Whether a scheduler loop ran: a failure after that is the run's (0.5.13's form B can
    come while SGLang serves its own readiness request), before it the environment's."""
    for rank in range(world_size):
        try:
            if (run_dir / f"rank{rank}.jsonl").stat().st_size > 0:
                return True
        except OSError:
            continue
    return False


def _environment_failure(verdict: Verdict, error: str) -> Verdict:
    """A server that never became ready failed as an environment (a settings assert, a missing
    driver, a bad flag): `undecided`, with the cause, and never a form or a rank to blame. The
    cause is the exception the classifier read from the first scheduler that raised (the rule
    book's traceback parser), else the launcher's own last error line."""
    cause = verdict.signature if verdict.outcome is Outcome.CRASH and verdict.signature else error
    return replace(verdict, outcome=Outcome.UNDECIDED, form=None, failed_rank=None,
                   culprit_rank=None, first_divergence=None,
                   signature=f"SGLang never became ready: {cause}",
                   evidence=[f"SGLang never became ready (the environment failed, not a rank): "
                             f"{cause}", f"launcher: {error}"])  # fmt: skip


def _reference(cfg: SglangRunConfig, requests: list[Any]) -> dict[str, Any]:
    from hicache_diag.sglang.reference import compute_reference

    return compute_reference(cfg.python, cfg.spec.model, requests)


def _watch_loop(server: SglangServer, client: WorkloadClient, cfg: SglangRunConfig,
                run_dir: Path, watch: _Watch, on_progress: Progress | None) -> None:  # fmt: skip
    progress = _Progress(run_dir, cfg.world_size)
    grace_until = None
    while client.outstanding:
        time.sleep(POLL_S)
        now = time.time()
        for s in server.poll():
            if watch.first_failure is None:
                watch.first_failure = {"rank": s.rank, "t": s.ended_at, "pid": s.pid,
                                       "exitcode": s.exitcode, "signal": s.signal}  # fmt: skip
                grace_until = now + CASCADE_GRACE_S
        # server.poll() marks a SIGSTOPped scheduler "stopped": it is live, and watched.
        live = {s.rank: s.pid for s in server.schedulers if s.state in ("running", "stopped")}
        watch.stops.poll(live, now)
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
    stopped = set(watch.stops.stopped_for(now))
    watch.hang = {
        "detected_at": now,
        "last_progress": {str(r): t for r, t in progress.last_t.items()},
        "last_steps": {str(r): s for r, s in progress.last_step.items()},
        "stalled_ranks": [s.rank for s in server.schedulers if s.state in ("running", "stopped")],
        "during_startup": not progress.last_step,
        "proc_status": {str(r): st for r, st in watch.stops.last_status.items()},
        "stopped_ranks": sorted(stopped),
    }
    watch.stacks = _dump_schedulers(server, run_dir, stopped)


def _dump_schedulers(server: SglangServer, run_dir: Path, skip: set[int]) -> dict[str, Any]:
    """py-spy every `sglang::scheduler*` process at once, under one deadline, as for the builtin
    ranks; a stopped one cannot be dumped (py-spy cannot suspend it) and is named by its kernel
    state instead. SGLang's schedulers have no SIGUSR1 faulthandler to fall back on."""
    alive = [s for s in server.schedulers if s.state == "running" and s.rank not in skip]
    return {"tool": "py-spy", "error": _pyspy_dumps(alive, run_dir)}


def _read_watchdog(text: str, run_dir: Path, server: SglangServer, watch: _Watch) -> None:
    """SGLang's own watchdog declared a hang: the deaths after it are its teardown, the stacks
    it dumped are the hang's evidence (DESIGN §8: hangs from py-spy of every scheduler)."""
    pids = {s.pid: s.rank for s in server.schedulers}
    dumped = harvest_pyspy_dumps(text, pids, run_dir / "stacks")
    fired = watchdog_firing(text, server.spec.tp_size)
    if fired is None or watch.hang is not None:
        return
    for s in server.schedulers:
        if s.state == "crashed":
            s.state = "killed"  # torn down by SGLang's launcher after its watchdog fired
    watch.first_failure = None
    watch.hang = {
        "detected_by": "sglang-watchdog",
        "observed_by": fired.rank,
        "watchdog_line": fired.line,
        "stalled_ranks": [s.rank for s in server.schedulers],
        "last_progress": {},
        "stopped_ranks": sorted(watch.stops.stopped_for(time.time())),
        "proc_status": {str(r): st for r, st in watch.stops.last_status.items()},
    }
    watch.stacks = {"tool": "py-spy (SGLang's watchdog)", "error": None if dumped else "none"}


def _finish_evidence(run_dir: Path, server: SglangServer, client: WorkloadClient | None,
                     watch: _Watch, started: str) -> None:  # fmt: skip
    logs = split_rank_logs(run_dir / "server.log", run_dir, server.spec.tp_size)
    try:
        text = (run_dir / "server.log").read_text(errors="replace")
    except OSError:
        text = ""  # no log: nothing below finds anything in it
    _apply_logged_exit_codes(text, server)
    _mark_logged_crashes(text, logs, server, watch)
    _read_watchdog(text, run_dir, server, watch)
    if client is not None:
        write_json(run_dir / "outputs.json", client.result.outputs)
        write_json(run_dir / "requests.json", {"cached": client.result.cached,
                                               "errors": client.result.errors,
                                               "latency_s": client.result.latency_s})  # fmt: skip
        if getattr(client, "events", None) is not None:  # a scripted workload's own timeline
            write_json(run_dir / "script.json", client.events)
    write_json(
        run_dir / "launcher.json",
        {
            "engine": "sglang",
            "ranks": [s.to_json() for s in server.schedulers],
            "first_failure": watch.first_failure,
            "hang": watch.hang,
            "stacks": watch.stacks or {"tool": None, "error": None},
            "interrupted": watch.interrupted,
            "startup_error": watch.startup_error,
            "timings": watch.timings,
            "started_at": started,
            "ended_at": utc_now(),
        },
    )


def _apply_logged_exit_codes(text: str, server: SglangServer) -> None:
    """SGLang's launcher logs each scheduler's exit code; ours only sees a vanished pid."""
    codes = {int(pid): int(code) for pid, code in _CHILD_EXIT_RE.findall(text)}
    for s in server.schedulers:
        if s.pid in codes and s.state in ("crashed", "exited"):
            s.exitcode = codes[s.pid]


def _mark_logged_crashes(
    text: str, logs: dict[int, Path], server: SglangServer, watch: _Watch
) -> None:
    """Process facts as SGLang shapes them. A scheduler whose loop died of an exception crashed,
    though it may exit 0: `run_scheduler_process` logs `Scheduler hit an exception`, SIGQUITs the
    launcher and returns (seen on 0.5.23). The launcher then SIGKILLs its whole tree, so the
    others' SIGKILL deaths are its teardown, and their order in our poll says nothing (seen on
    0.5.12.post1: PP0 and PP1 SIGKILLed 40 us apart after PP1 raised): the first failure is
    the scheduler that raised first. Only a root-cause traceback does this: when the only ones
    are cascades (`Connection closed by peer`), a SIGKILL death may be the cause itself."""
    crashes = {}
    for rank, path in logs.items():
        crash = parse_crash(rank, path.read_text(errors="replace"))
        if crash is not None and crash.fatal:
            crashes[rank] = crash
    for s in server.schedulers:
        if s.rank in crashes and s.state in ("exited", "crashed"):
            s.state = "crashed"
    primary = [c for c in crashes.values() if c.kind != "secondary"]
    if not primary or not LAUNCHER_TEARDOWN_RE.search(text):
        return  # only cascades: a death without a traceback may be the root (a SIGKILLed rank)
    first = min(primary, key=lambda c: (c.t or 0.0, c.rank))
    for s in server.schedulers:
        # Log times have whole seconds: a SIGKILL from the same second on is the teardown.
        after = first.t is None or s.ended_at is None or s.ended_at >= first.t
        if s.rank not in crashes and s.state == "crashed" and s.signal == signal.SIGKILL and after:
            s.state = "killed"
    s = next((s for s in server.schedulers if s.rank == first.rank), None)
    if s is not None:
        watch.first_failure = {"rank": s.rank, "t": first.t or s.ended_at, "pid": s.pid,
                               "exitcode": s.exitcode, "signal": s.signal}  # fmt: skip


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
            current = (parse_rank_tokens(m.group("tokens")) or RankId()).flat(tp_size)
        elif line.startswith("["):
            current = None  # the launcher's own lines
        if current is not None:
            by_rank.setdefault(current, []).append(line)
    paths = {}
    for rank, rank_lines in by_rank.items():
        paths[rank] = run_dir / f"rank{rank}.log"
        paths[rank].write_text("".join(rank_lines))
    return paths
