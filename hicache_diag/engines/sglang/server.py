"""Launch real SGLang (`python -m sglang.launch_server`) under the harness, and reap it.

The server runs in its own session (process group), with the plugin's `sitecustomize` on its
PYTHONPATH only. Readiness is polled over HTTP under a deadline; a server that dies first is
reported with the last error line of its log. `close()` kills the whole tree on every path:
the process group, then any descendant that left it (psutil), and waits for each.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psutil

from hicache_diag import evidence as ev
from hicache_diag.engines.sglang import build_locks
from hicache_diag.engines.sglang.bundle import plugin_bundle
from hicache_diag.engines.sglang.launch_spec import LaunchSpec
from hicache_diag.engines.sglang.plugin import config as plugin_config
from hicache_diag.engines.sglang.ports import free_port
from hicache_diag.engines.sglang.release import SglangInstall
from hicache_diag.engines.sglang.startup_log import (
    last_error_line,
    log_tail,
    port_taken_line,
    startup_phase,
)
from hicache_diag.errors import EngineStartError
from hicache_diag.evidence.ranks import RankId, parse_rank_tokens
from hicache_diag.trials.signals import die_with_parent, signal_group

READY_TIMEOUT_S = 240.0  # 35-75 s measured on 2 cores; headroom for a loaded CI box
# A box shared by several SGLang launches (load 14 on 2 cores) needs more: seconds, as an env var.
READY_TIMEOUT_ENV = "HICACHE_DIAG_SGLANG_READY_TIMEOUT"


def ready_timeout_s() -> float:
    try:
        value = float(os.environ.get(READY_TIMEOUT_ENV, ""))
    except ValueError:
        return READY_TIMEOUT_S
    return value if value > 0 and value == value and value != float("inf") else READY_TIMEOUT_S


_TITLE_RE = re.compile(r"^sglang::scheduler(?P<rest>\S*)")


class ServerStartError(EngineStartError):
    """SGLang did not come up; the message names the log line that says why."""


@dataclass
class SchedulerProc:
    pid: int
    pp: int
    tp: int
    title: str
    rank: int = 0
    state: str = "running"  # running | exited | crashed | killed | stopped
    exitcode: int | None = None
    signal: int | None = None
    ended_at: float | None = None
    proc: psutil.Process | None = field(default=None, repr=False)
    node: str | None = None  # the node whose server runs it (`--nnodes`: sglang/nodes.py)
    host: str | None = None  # --hosts: the machine of that node
    seen_by: str | None = None  # --hosts: how its facts were read there (never our /proc)

    def own_facts(self) -> dict[str, Any]:
        # vanished: ended with no exit status we could read (its parent reaped it first).
        vanished = self.state == "crashed" and self.exitcode is None and self.signal is None
        where = {k: v for k, v in (("node", self.node), ("host", self.host)) if v}
        seen = {"seen_by": self.seen_by} if self.seen_by else {}
        return {**where, "title": self.title, "vanished": vanished, **seen}


def parse_title(cmdline: str) -> RankId | None:
    """`sglang::scheduler_PP1_TP0` -> PP1 TP0 (no tokens: PP0 TP0); None for other processes."""
    m = _TITLE_RE.match(cmdline)
    if not m:
        return None
    return parse_rank_tokens(m.group("rest")) or RankId()


# A port taken between our pick and SGLang's bind (ports.py: the race SGLang's own launcher
# takes too) fails a start through no fault of anyone's; it is picked again this many times.
PORT_RELAUNCHES = 2


class SglangServer:
    # Its processes are on other machines (engines/sglang/node_server.py): watched and dumped there,
    # never through this machine's psutil, /proc or py-spy.
    remote = False
    # One launch on one port of this machine: a start that lost its port is relaunched on a
    # fresh one. Launches whose nodes agree on ports among themselves are not.
    relaunch_on_taken_port = True

    def __init__(
        self, install: SglangInstall, spec: LaunchSpec, run_dir: Path, log: Path | None = None
    ) -> None:
        self.install, self.spec, self.run_dir = install, spec, run_dir
        self._log_path = log or run_dir / ev.SERVER_LOG  # a warm server's: the pool's own
        self.port = free_port()
        self.popen: subprocess.Popen | None = None
        self.schedulers: list[SchedulerProc] = []
        self._log: IO[Any] | None = None
        self.started_at = self.ready_at = None
        self._ext_root: Path | None = None
        self._locks_before: set[Path] = set()
        self.removed_locks: list[Path] = []  # build locks our kill left behind, removed
        self.relaunches: list[str] = []  # why a start was relaunched on a fresh port
        self._plugin_path: Path | None = None
        self._log_start = 0  # where this launch's lines begin in the log

    @property
    def log_path(self) -> Path:
        return self._log_path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self, plugin_path: Path) -> dict[str, str]:
        env = dict(os.environ)
        # The plugin comes from its bundle (plain files), never from the tool's environment:
        # a release's interpreter imports only its own packages.
        # --patch's overlay comes before the release's site-packages, so `import sglang` finds it.
        path = (plugin_bundle().pythonpath(boot=True), *self.spec.pythonpath, env.get("PYTHONPATH"))
        env["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
        env["PYTHONNOUSERSITE"] = "1"
        env[plugin_config.ENV_VAR] = str(plugin_path)
        env["PYTHONUNBUFFERED"] = "1"
        if self.spec.cpu:
            env["SGLANG_USE_CPU_ENGINE"] = "1"
            cores = max(1, os.cpu_count() or 1)
            # One entry per rank of the world or per TP rank, as the release reads it.
            ranks = self.install.launch.omp_bind_entries(self.spec.pp_size, self.spec.tp_size)
            env.setdefault(
                "SGLANG_CPU_OMP_THREADS_BIND", "|".join(str(r % cores) for r in range(ranks))
            )
            # SGLang binds each rank's OpenMP threads to its cores only through sgl_kernel's
            # init_cpu_threads_env (AMX or arm64 hosts); elsewhere it warns and binds nothing,
            # so every rank's torch opens a thread per core and they spin against each other
            # (a PP2 step took 140 ms, 5x its 1-thread time). Each rank gets its share instead.
            env.setdefault("OMP_NUM_THREADS", str(max(1, cores // self.ranks_here())))
        if self.spec.hicache_storage_dir:
            env["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"] = self.spec.hicache_storage_dir
        env.update(dict(self.spec.env))
        return env

    def ranks_here(self) -> int:
        """How many scheduler processes this server starts on its own machine."""
        return self.spec.pp_size * self.spec.tp_size

    def start(self, plugin_path: Path) -> None:
        env = self.env(plugin_path)
        self._ext_root = build_locks.extensions_root(env)
        blocking = build_locks.built_by(
            self.install.package_dir, build_locks.stale_locks(self._ext_root)
        )
        if blocking:
            raise ServerStartError(
                f"stale torch-extension build lock at {blocking[0]} (no process holds it: a "
                "build was killed; every launch of this release would wait on it forever): "
                "remove it and rerun"
            )
        self._locks_before = build_locks.find_locks(self._ext_root)
        self._plugin_path = plugin_path
        self._log = open(self.log_path, "ab", buffering=0)
        self._log_start = self._log.tell()
        self.started_at = time.time()
        self.popen = subprocess.Popen(
            self.spec.argv(self.install.python, self.port),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=self.run_dir,
            start_new_session=True,  # one process group: reaped as one
            # SGLang's schedulers and detokenizer die with launch_server (PR_SET_PDEATHSIG),
            # and launch_server with us, even when we are SIGKILLed.
            preexec_fn=die_with_parent,
        )

    def wait_ready(
        self, timeout_s: float | None = None, on_phase: Callable[[str], None] | None = None
    ) -> float:
        """Seconds from start to the first healthy /health_generate. `on_phase(text)` hears the
        start-up phase (from the server log) every poll, for a status line."""
        assert self.popen is not None
        timeout_s = ready_timeout_s() if timeout_s is None else timeout_s
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if on_phase is not None:
                on_phase(startup_phase(log_tail(self.log_path)))
            try:
                self.check_running()
            except ServerStartError:
                if not self._relaunched_on_fresh_port():
                    raise
                continue
            if self._healthy():
                self.ready_at = time.time()
                self.discover()
                return self.ready_at - self.started_at
            time.sleep(0.5)
        raise ServerStartError(
            f"SGLang was not ready after {timeout_s:.0f} s: {last_error_line(self.log_path)} "
            f"(log: {self.log_path})"
        )

    def check_running(self) -> None:
        """Raises ServerStartError when the launcher has exited (start-up)."""
        if self.popen is not None and self.popen.poll() is not None:
            raise ServerStartError(
                f"SGLang exited ({self.popen.returncode}) before it was ready: "
                f"{last_error_line(self.log_path)} (log: {self.log_path})"
            )

    def _relaunched_on_fresh_port(self) -> bool:
        """The launcher exited because a port it binds was taken since we picked it: reap this
        launch and start again on a fresh port (at most PORT_RELAUNCHES times)."""
        if not self.relaunch_on_taken_port or len(self.relaunches) >= PORT_RELAUNCHES:
            return False
        taken = port_taken_line(self.log_path, self._log_start)
        if taken is None or self._plugin_path is None:
            return False
        old = self.port
        self.close()
        self.port = free_port()
        self.relaunches.append(
            f"port {old} was taken before SGLang bound it ({taken}); relaunched on port {self.port}"
        )
        self.start(self._plugin_path)
        return True

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health_generate", timeout=5) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError, TimeoutError):
            return False

    def discover(self) -> list[SchedulerProc]:
        """The scheduler processes, as SGLang's own `collect_scheduler_processes` finds them."""
        found = []
        for proc in self._tree():
            try:
                title = " ".join(proc.cmdline()).strip()
            except psutil.Error:
                continue
            ids = parse_title(title)
            if ids is None:
                continue
            found.append(
                SchedulerProc(
                    proc.pid, ids.pp, ids.tp, title, ids.flat(self.spec.tp_size), proc=proc
                )
            )
        self.schedulers = sorted(found, key=lambda s: s.rank)
        return self.schedulers

    def poll(self) -> list[SchedulerProc]:
        """Update each scheduler's state; return those that ended since the last poll."""
        ended = []
        for s in self.schedulers:
            if s.state not in ("running", "stopped") or s.proc is None:
                continue
            try:
                status = s.proc.status()
            except psutil.NoSuchProcess:
                status = psutil.STATUS_DEAD
            if status in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
                s.exitcode, s.signal = zombie_exit_status(s.pid)
                s.state = "exited" if s.exitcode == 0 else "crashed"
                s.ended_at = time.time()
                ended.append(s)
            else:
                s.state = "stopped" if status == psutil.STATUS_STOPPED else "running"
        return ended

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def _tree(self) -> list[psutil.Process]:
        if self.popen is None:
            return []
        try:
            root = psutil.Process(self.popen.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def close(self, grace_s: float = 0.0) -> float:
        """Kill the whole tree (SIGKILL after `grace_s` of SIGTERM); seconds it took."""
        t0 = time.time()
        if self.popen is None:
            return 0.0
        procs = self._tree() + [s.proc for s in self.schedulers if s.proc is not None]
        for proc in procs:  # a SIGSTOPped scheduler takes no SIGTERM until it runs again
            try:
                proc.resume()
            except psutil.Error:
                pass
        if grace_s > 0 and self.popen.poll() is None:
            signal_group(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        signal_group(self.popen.pid, signal.SIGKILL)
        for proc in procs:
            try:
                proc.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(procs, timeout=10)
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for s in self.schedulers:
            if s.state in ("running", "stopped"):
                s.state = "killed"
        if self._ext_root is not None:  # a JIT build we killed must not block the next launch
            ours = build_locks.find_locks(self._ext_root) - self._locks_before
            self.removed_locks = build_locks.remove_locks(
                build_locks.stale_locks(self._ext_root, among=ours)
            )
        if self._log is not None:
            self._log.close()
        return time.time() - t0


def zombie_exit_status(pid: int) -> tuple[int | None, int | None]:
    """(exit code, signal) of a dead scheduler. It is launch_server's child, not ours, so
    waitpid cannot tell; while it is a zombie, /proc/PID/stat's last field holds its wait
    status (Linux >= 3.5). (None, None) once its parent has reaped it."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            status = int(fh.read().rsplit(" ", 1)[-1])
    except (OSError, ValueError):
        return None, None
    if status & 0x7F:
        return None, status & 0x7F
    return status >> 8, None
