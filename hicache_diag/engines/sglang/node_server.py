"""`run --engine sglang --nnodes N --hosts A,B`: every node's `launch_server` on its host through
the ssh executor, seen only from there.

Node i runs `ssh HOST python -c LIFELINE RUN_DIR env K=V.. python -m sglang.launch_server ..
--nnodes N --node-rank i --dist-init-addr ADDR0:PORT` (SGLang's own flags, sglang/nodes.py): the
launch in its own process group on the host, killed when the ssh session ends (our close, a
Ctrl-C, our death: the client dies with us) or when launch_server exits. Its output (SGLang
logs to stderr) comes back through ssh into the run dir's one server.log. The node's launcher
is the ssh session: its exit is the node's exit. Its schedulers are found and watched (alive,
stopped, exit status) by the collector in watch mode (node_watch.py) and their stacks taken by
the collector's one-shot fan-out (`triage --live --via ssh`'s path): never through this
machine's psutil, /proc or py-spy, whose pids are not theirs. A node whose watch session ends
unasked is lost: the run is the environment's (`undecided`), its ranks never blamed."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from hicache_diag import evidence as ev
from hicache_diag.cluster.base import LIFELINE, Sampling
from hicache_diag.cluster.fanout import fan_out
from hicache_diag.cluster.ssh import SshExecutor
from hicache_diag.engines.sglang.install import SglangInstall
from hicache_diag.engines.sglang.launch_spec import LaunchSpec
from hicache_diag.engines.sglang.node_watch import NodeWatch
from hicache_diag.engines.sglang.nodes import OMP_BIND, node_ranks, omp_bind
from hicache_diag.engines.sglang.ports import http_url
from hicache_diag.engines.sglang.server import (
    SchedulerProc,
    ServerStartError,
    SglangServer,
    parse_title,
)
from hicache_diag.engines.sglang.startup_log import last_error_line
from hicache_diag.triage.cluster_live import LEAD_S
from hicache_diag.trials.rundir import write_json
from hicache_diag.trials.signals import die_with_parent

SEEN_BY = "collector.py over ssh"
# The user's own settings SGLang and torch read, sent along (the rest of their environment is
# the host's own login environment).
FORWARD = ("SGLANG_", "HF_", "TRANSFORMERS_", "TORCH_")
DISCOVER_S = 60.0  # after /health_generate answers, every node's schedulers are up
EXIT_SETTLE_S = 5.0  # a launcher's exit waits this long for its node's facts after it
CLOSE_WAIT_S = 15.0
STACK_DEADLINE_S = 4.0
# The kernel's state letters as psutil names them (trials/proc_facts.py StopWatch reads these).
STATES = {
    "R": "running",
    "S": "sleeping",
    "D": "disk-sleep",
    "T": "stopped",
    "t": "tracing-stop",
    "Z": "zombie",
    "X": "dead",
    "I": "idle",
}


class SshNodes(SglangServer):
    """Every node of the launch on its host (`executor.nodes[i]`: node-i at hosts[i]), its
    `--port` `ports[i]`, free on that host (remote_nodes.py asked it)."""

    remote = True
    relaunch_on_taken_port = False  # the nodes' ports are agreed among them (dist-init-addr)

    def __init__(
        self,
        install: SglangInstall,
        specs: list[LaunchSpec],
        run_dir: Path,
        executor: SshExecutor,
        ports: list[int],
    ) -> None:
        super().__init__(install, specs[0], run_dir)
        self.specs, self.executor = specs, executor
        self.ports, self.port = list(ports), ports[0]
        self.launchers: list[subprocess.Popen] = []
        self.watches = [NodeWatch(executor, n) for n in executor.nodes]
        self.exited_at: dict[int, float] = {}
        self.lost: dict[str, str] = {}  # node -> why its link ended
        self.left: dict[str, int] = {}  # node -> schedulers still there after close
        self.stack_links: dict[str, Any] = {}

    @property
    def url(self) -> str:
        return http_url(self.spec.host, self.port)  # node 0's address (nodes.host_specs)

    def host_of(self, i: int) -> str:
        return self.executor.nodes[i].address

    def remote_env(self, plugin_path: Path, spec: LaunchSpec) -> dict[str, str]:
        """What this launch sets beyond the host's own login environment."""
        env = SglangServer.env(self, plugin_path)
        if spec.cpu and OMP_BIND not in os.environ:
            env[OMP_BIND] = omp_bind(self.install, spec)
        return {k: v for k, v in env.items() if os.environ.get(k) != v or k.startswith(FORWARD)}

    def launch_argv(self, i: int, plugin_path: Path) -> list[str]:
        spec, python = self.specs[i], self.install.python
        env = [f"{k}={v}" for k, v in sorted(self.remote_env(plugin_path, spec).items())]
        remote = [python, "-c", LIFELINE, str(self.run_dir), "env", *env]
        return self.executor.argv(self.executor.nodes[i], remote + spec.argv(python, self.ports[i]))

    def start(self, plugin_path: Path) -> None:
        self._log = open(self.log_path, "ab", buffering=0)
        self.started_at = time.time()
        for w in self.watches:
            w.start()
        for i in range(len(self.specs)):
            proc = subprocess.Popen(
                self.launch_argv(i, plugin_path),
                stdin=subprocess.PIPE,  # never written: kept open, the node's lifeline
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
            self.launchers.append(proc)
        self.popen = self.launchers[0]

    def check_running(self) -> None:
        for i, proc in enumerate(self.launchers):
            node, host = self.executor.nodes[i].name, self.host_of(i)
            if (why := self.watches[i].lost) is not None:
                raise ServerStartError(f"{node} ({host}): the ssh link ended: {why}")
            if proc.poll() is not None:
                raise ServerStartError(
                    f"{node} ({host}): SGLang exited ({proc.returncode}) before it was ready: "
                    f"{last_error_line(self.log_path)} (log: {self.log_path})"
                )

    def discover(self) -> list[SchedulerProc]:
        """Each node's schedulers as its collector sees them (pids in the node's own process
        table), once every node shows the ranks SGLang puts there."""
        found = [s for i in range(len(self.specs)) for s in self._node_schedulers(i)]
        self.schedulers = sorted(found, key=lambda s: s.rank)
        return self.schedulers

    def _node_schedulers(self, i: int) -> list[SchedulerProc]:
        w, node, want = self.watches[i], self.executor.nodes[i], len(node_ranks(self.specs[i]))
        end, procs = time.time() + DISCOVER_S, []
        while time.time() < end:
            doc = w.after(time.time(), min(5.0, end - time.time()))
            procs = [p for p in (doc or {}).get("processes", []) if parse_title(p["title"])]
            if len(procs) >= want or w.ended():
                break
        if len(procs) < want:
            raise ServerStartError(
                f"{node.name} ({node.address}): its collector found {len(procs)} of {want} "
                f"scheduler(s) ({w.lost or 'ready, but not all found'})"
            )
        out = []
        for p in procs:
            ids = parse_title(p["title"])
            s = SchedulerProc(p["pid"], ids.pp, ids.tp, p["title"], ids.flat(self.spec.tp_size))
            s.node, s.host, s.seen_by = node.name, node.address, SEEN_BY
            out.append(s)
        return out

    def _facts(self, s: SchedulerProc) -> dict[str, Any] | None:
        """The scheduler's latest kernel facts on its node (None: gone from its table)."""
        doc = self._watch(s.node).doc or {}
        proc = next((p for p in doc.get("processes", []) if p["pid"] == s.pid), None)
        return proc.get("proc") if proc else None

    def _watch(self, node: str | None) -> NodeWatch:
        return next(w for w in self.watches if w.node.name == node)

    def poll(self) -> list[SchedulerProc]:
        ended = []
        for s in self.schedulers:
            if s.state not in ("running", "stopped") or self._watch(s.node).lost:
                continue  # a lost node's ranks are never judged
            facts = self._facts(s)
            state = (facts or {}).get("state", "gone")[:1]
            if state in ("Z", "X", "g"):
                s.exitcode, s.signal = _wait_status((facts or {}).get("wait_status"))
                s.state = "exited" if s.exitcode == 0 else "crashed"
                s.ended_at = time.time()
                ended.append(s)
            else:
                s.state = "stopped" if state in ("T", "t") else "running"
        return ended

    def kernel_states(self, ranks: list[SchedulerProc]) -> dict[int, str]:
        """rank -> psutil's name of its state on its node (for the trial loop's StopWatch)."""
        out = {}
        for s in ranks:
            letter = ((self._facts(s) or {}).get("state") or "gone")[:1]
            out[s.rank] = STATES.get(letter, "gone")
        return out

    def alive(self) -> bool:
        """Every node's launcher and watch running. A launcher that ended counts once its node
        has been read after it (so the scheduler that failed first is the one blamed, not the
        launcher's exit), or after EXIT_SETTLE_S; a watch that ended unasked is a lost node."""
        for i, proc in enumerate(self.launchers):
            node = self.executor.nodes[i].name
            if (why := self.watches[i].lost) is not None:
                self.lost.setdefault(node, why)
                return False
            if proc.poll() is None:
                continue
            t = self.exited_at.setdefault(i, time.time())
            if self.watches[i].after(t, 0.0) is not None or time.time() - t > EXIT_SETTLE_S:
                return False
        return bool(self.launchers)

    def close(self, grace_s: float = 0.0) -> float:
        """End every node's session: stdin's end makes its lifeline kill the launch's group on
        the host; an ssh client that lingers is killed here (the host then sees the link end).
        Then each node's watch says what is left there."""
        t0 = time.time()
        for proc in self.launchers:
            _close(proc.stdin)
        for proc in self.launchers:
            try:
                proc.wait(timeout=CLOSE_WAIT_S)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
        ended = time.time()
        for w in self.watches:
            doc = None if w.lost else w.after(ended, 5.0)
            if doc is not None:
                self.left[w.node.name] = sum(1 for p in doc["processes"] if parse_title(p["title"]))
            w.close()
        for s in self.schedulers:
            if s.state in ("running", "stopped"):
                s.state = "killed"
        if self._log is not None:
            self._log.close()
        return time.time() - t0

    def dump_stacks(self, run_dir: Path, ranks: list[SchedulerProc]) -> ev.StacksRecord:
        """Every rank's stack through the collector on its node, all at one instant."""
        at = time.time() + LEAD_S["ssh"]
        sampling = Sampling(at, samples=1, deadline=STACK_DEADLINE_S, budget=30.0)
        answers = fan_out(self.executor, self.executor.nodes, sampling, 30.0)
        results = {r.node.name: r for r in answers}
        errors = []
        for s in ranks:
            res = results[s.node]
            procs = (res.doc or {}).get("processes", []) if res.ok else []
            proc = next((p for p in procs if p["pid"] == s.pid), None)
            sample = proc["samples"][0] if proc and proc.get("samples") else {}
            self.stack_links[str(s.rank)] = [x for x in sample.get("links", []) if x.get("ok")]
            if sample.get("threads"):
                write_json(ev.stack_json(run_dir, s.rank), sample["threads"])
            else:
                errors.append(f"rank{s.rank} ({s.node}): {res.error or 'no stack'}")
        return ev.StacksRecord(SEEN_BY, "; ".join(errors) or None)

    def launch_lines(self) -> list[dict[str, Any]]:
        """The manifest's `sglang.nodes`: each node's host, SGLang argv and ranks."""
        return [
            {
                "node": self.executor.nodes[i].name,
                "node_rank": spec.node_rank,
                "host": self.host_of(i),
                "address": spec.host,
                "via": "ssh",
                "ranks": [f"PP{pp} TP{tp}" for pp, tp in node_ranks(spec)],
                "argv": spec.argv(self.install.python, self.ports[i]),
            }
            for i, spec in enumerate(self.specs)
        ]

    def launcher_extra(self) -> dict[str, Any]:
        """launcher.json: how each node was reached and watched, and what was left there."""
        nodes = {}
        for i, w in enumerate(self.watches):
            doc = w.doc or {}
            nodes[w.node.name] = {
                "host": self.host_of(i),
                "hostname": doc.get("hostname"),
                "launcher": "ssh",
                "facts": SEEN_BY + " --watch",
                "stacks": SEEN_BY if self.stack_links else None,
                "launcher_exit": self.launchers[i].returncode if i < len(self.launchers) else None,
                "lost": self.lost.get(w.node.name),
                "schedulers_left": self.left.get(w.node.name),
            }
        return {"nodes": nodes, "stack_links": self.stack_links}


def _wait_status(status: int | None) -> tuple[int | None, int | None]:
    """(exit code, signal) from a zombie's wait status; (None, None) when it was reaped."""
    if status is None:
        return None, None
    if status & 0x7F:
        return None, status & 0x7F
    return status >> 8, None


def _close(stream: Any) -> None:
    try:
        stream.close()
    except OSError:
        pass


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
