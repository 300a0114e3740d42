"""The executor contract: which nodes, how to run `python3 - ARGS` on one, and a parallel
fan-out with a per-node timeout that leaves nothing running (Ctrl-C included)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

COLLECTOR = Path(__file__).with_name("collector.py")
MARKER = "--hicache-diag-collector"  # collector.py's; it is imported by nothing of ours


@dataclass(frozen=True, slots=True)
class Node:
    """One place the collector runs: `name` labels its ranks (`node-1 PP1 TP0`)."""

    name: str
    address: str  # what the launcher is given: an ssh host, a Slurm node, a pod


@dataclass(slots=True)
class NodeResult:
    """One node's answer: its collector's JSON document, or why there is none."""

    node: Node
    doc: dict[str, Any] | None = None
    error: str | None = None
    elapsed_s: float = 0.0
    returncode: int | None = None
    stderr: str = ""

    @property
    def ok(self) -> bool:
        return self.doc is not None and "error" not in self.doc


@dataclass(slots=True)
class Executor:
    """A launcher. Subclasses say which nodes there are and the argv that runs a command on
    one; `explain` turns a failed launch's stderr into one line."""

    name: str = "local"
    nodes: list[Node] = field(default_factory=list)

    def resolve(self) -> list[Node]:
        """The nodes to visit; raises UsageError when the target does not exist."""
        return self.nodes

    def argv(self, node: Node, remote: list[str]) -> list[str]:
        raise NotImplementedError

    def explain(self, node: Node, returncode: int | None, stderr: str) -> str:
        return _last_line(stderr) or f"exit status {returncode}"


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


@dataclass(frozen=True, slots=True)
class Sampling:
    """When and how the collectors sample: `at` is the agreed wall-clock instant of sample 0."""

    at: float
    samples: int = 2
    interval: float = 0.5
    deadline: float = 5.0  # seconds per fallback link per process
    budget: float = 60.0  # a collector never lives longer than this


# Reads exactly `size` bytes of collector.py from stdin and runs it, leaving stdin open: its
# end-of-file then tells the collector that the command that started it is gone (Ctrl-C, a
# timeout, a dropped connection), whatever sits between (sshd, srun, kubectl exec).
BOOTSTRAP = (
    "import sys;n=int(sys.argv[1]);s=sys.stdin.buffer.read(n);len(s)==n or sys.exit(3);"
    "sys.argv=['collector.py']+sys.argv[2:];"
    "exec(compile(s,'collector.py','exec'),{'__name__':'__main__'})"
)


# On the host: chdir, run the command (a trial, a node's SGLang server) in its own process group,
# and kill that group when stdin ends (the ssh connection is gone: killed on timeout or Ctrl-C,
# the link dropped) or when the command itself exits, so nothing stays running there.
LIFELINE = """\
import os, signal, subprocess, sys, threading
os.chdir(sys.argv[1])
p = subprocess.Popen(sys.argv[2:], stdin=subprocess.DEVNULL, start_new_session=True)
def lifeline():
    while os.read(0, 65536):
        pass
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except OSError:
        pass
threading.Thread(target=lifeline, daemon=True).start()
rc = p.wait()
try:
    os.killpg(p.pid, signal.SIGKILL)  # what the command left in its group
except OSError:
    pass
os._exit(128 - rc if rc < 0 else rc)  # not sys.exit: the reader thread holds stdin
"""


def collector_args(node: Node, s: Sampling, size: int) -> list[str]:
    """`python3 -c BOOTSTRAP SIZE ARGS`: the collector arrives through stdin, nothing is
    installed or written on the node."""
    args = ["python3", "-c", BOOTSTRAP, str(size), MARKER, "--lifeline", "--node", node.name]
    args += ["--at", f"{s.at:.3f}", "--samples", str(s.samples), "--interval", str(s.interval)]
    return args + ["--deadline", str(s.deadline), "--budget", str(s.budget)]


def remote_command(args: list[str]) -> str:
    """One shell line for launchers that hand the remote side a string (ssh)."""
    return " ".join(shlex.quote(a) for a in args)
