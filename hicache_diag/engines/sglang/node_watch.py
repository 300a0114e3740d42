"""A node's processes watched from here: the collector in `--watch` mode, shipped through the
executor's stdin as for `triage --live` (base.py BOOTSTRAP), printing one JSON line per
interval (each scheduler's pid in the node's own process table, title, kernel state, a
zombie's wait status) until its stdin ends. One ssh session per node for a whole run, so
nothing about the node is read from this machine's /proc.

The session never ends by itself: when it does (ssh's exit, the link dropped, the node gone)
the node is lost, and `lost` says why."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from typing import Any

from hicache_diag.cluster.base import BOOTSTRAP, COLLECTOR, MARKER, Executor, Node
from hicache_diag.trials.signals import die_with_parent

WATCH_BUDGET_S = 7 * 24 * 3600.0  # the stdin lifeline ends it; the budget only bounds a leak


def watch_args(node: Node, interval: float, size: int) -> list[str]:
    """`python3 -c BOOTSTRAP SIZE ... --watch INTERVAL`: collector.py's watch mode."""
    args = ["python3", "-c", BOOTSTRAP, str(size), MARKER, "--lifeline", "--node", node.name]
    return args + ["--at", "0", "--budget", str(WATCH_BUDGET_S), "--watch", str(interval)]


class NodeWatch:
    """The latest facts of one node's schedulers, read by a thread from its collector."""

    def __init__(self, executor: Executor, node: Node, interval: float = 0.5) -> None:
        self.executor, self.node, self.interval = executor, node, interval
        self.doc: dict[str, Any] | None = None  # the latest line
        self.proc: subprocess.Popen | None = None
        self.closing = False
        self._stderr = b""
        self._cond = threading.Condition()

    def start(self) -> None:
        source = COLLECTOR.read_bytes()
        argv = self.executor.argv(self.node, watch_args(self.node, self.interval, len(source)))
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # a Ctrl-C is ours to handle: close() ends it
            preexec_fn=die_with_parent,
        )
        self.proc.stdin.write(source)
        self.proc.stdin.flush()  # and kept open: the collector's lifeline
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for raw in self.proc.stdout:
            try:
                doc = json.loads(raw)
            except ValueError:
                continue
            with self._cond:
                self.doc = doc
                self._cond.notify_all()
        self._stderr = self.proc.stderr.read() if self.proc.stderr else b""
        with self._cond:
            self._cond.notify_all()

    def ended(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None

    @property
    def lost(self) -> str | None:
        """Why the watch ended without our asking (None while it runs, or after close())."""
        if self.closing or not self.ended():
            return None
        rc = self.proc.returncode
        return self.executor.explain(self.node, rc, self._stderr.decode(errors="replace"))

    def after(self, t: float, timeout: float) -> dict[str, Any] | None:
        """The first line written after wall-clock `t` (None: none within `timeout`, or the
        watch ended)."""
        end = time.monotonic() + timeout
        with self._cond:
            while not (self.doc and self.doc.get("t", 0) > t):
                left = end - time.monotonic()
                if left <= 0 or self.ended():
                    return None
                self._cond.wait(min(left, 0.2))
            return self.doc

    def close(self) -> None:
        """End the session: stdin's end stops the collector; the ssh client is killed if it
        lingers."""
        self.closing = True
        if self.proc is None:
            return
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
