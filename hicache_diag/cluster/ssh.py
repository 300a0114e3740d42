"""The ssh executor: the OpenSSH client with the user's own config, keys and jump hosts
(`-F FILE` when given); BatchMode, so a refused key fails at once instead of prompting."""

from __future__ import annotations

import os
import stat
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from hicache_diag.cluster.base import Executor, Node, remote_command
from hicache_diag.errors import UsageError

# OpenSSH's own wording -> what the user should read; its first matching line wins.
_SSH_ERRORS = (
    ("could not resolve hostname", "unknown host"),
    ("permission denied", "key refused"),
    ("connection refused", "connection refused (no sshd listening)"),
    ("connection timed out", "connection timed out"),
    ("no route to host", "no route to host"),
    ("host key verification failed", "host key verification failed"),
)


@dataclass(slots=True)
class SshExecutor(Executor):
    config: str | None = None  # ssh -F FILE
    connect_timeout: float = 5.0

    def __post_init__(self) -> None:
        self.name = "ssh"
        if not self.nodes:
            raise UsageError("--via ssh needs --hosts HOST[,HOST...]")
        if self.config is not None:
            _check_config(self.config)

    def argv(self, node: Node, remote: list[str]) -> list[str]:
        opts = ["-F", self.config] if self.config else []
        opts += ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, int(self.connect_timeout))}"]
        opts += ["-o", "ServerAliveInterval=2", "-o", "ServerAliveCountMax=2", "-T"]
        return ["ssh", *opts, node.address, remote_command(remote)]

    def explain(self, node: Node, returncode: int | None, stderr: str) -> str:
        text = stderr.lower()
        for needle, what in _SSH_ERRORS:
            if needle in text:
                return f"ssh {node.address}: {what}"
        if returncode == 127 or "python3: command not found" in text:
            return f"ssh {node.address}: no python3 on the node"
        if returncode == 255:
            return f"ssh {node.address}: the connection or the collector ended without a result"
        return f"ssh {node.address}: collector ended without a result (exit status {returncode})"


def _check_config(path: str) -> None:
    """ssh -F reads a regular file: a device (/dev/zero), a FIFO or a folder would make every
    host look unreachable, so it is refused here in one line, blamed on the file."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise UsageError(f"--ssh-config {path!r} cannot be read: {exc.strerror}") from None
    if not stat.S_ISREG(mode):
        raise UsageError(f"--ssh-config {path!r} is not a regular file; give an ssh config file")
    if not os.access(path, os.R_OK):
        raise UsageError(f"--ssh-config {path!r} is not readable")


def parse_hosts(text: str) -> list[Node]:
    """`a,b,c` -> one node per host, labelled by the host as given."""
    hosts = [h.strip() for h in text.split(",")]
    if not hosts or any(not h or h.startswith("-") or " " in h for h in hosts):
        raise UsageError(f"--hosts {text!r}: give HOST[,HOST...] (names from your ssh config)")
    if len(set(hosts)) != len(hosts):
        raise UsageError(f"--hosts {text!r}: a host is named twice")
    return [Node(h, h) for h in hosts]


PROBE_TIMEOUT_S = 15.0


def probe(executor: SshExecutor, remote: list[str]) -> list[tuple[Node, str | None, str]]:
    """Run `remote` on every node at once (`ssh HOST true` says the host answers); per node:
    (node, why it failed or None, its stdout)."""

    def one(node: Node) -> tuple[Node, str | None, str]:
        argv = executor.argv(node, remote)
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return node, f"ssh {node.address}: no answer in {PROBE_TIMEOUT_S:g} s", ""
        if done.returncode == 0:
            return node, None, done.stdout
        return node, executor.explain(node, done.returncode, done.stderr), done.stdout

    with ThreadPoolExecutor(max_workers=min(16, len(executor.nodes))) as pool:
        return list(pool.map(one, executor.nodes))


def hostname(executor: SshExecutor, node: Node) -> str:
    """The address ssh connects to for `node` (`ssh -G`: its config's HostName, else the name
    as given): what the other nodes and this machine dial."""
    opts = ["-F", executor.config] if executor.config else []
    try:
        done = subprocess.run(
            ["ssh", *opts, "-G", node.address], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return node.address
    for line in done.stdout.splitlines():
        key, _, value = line.partition(" ")
        if key == "hostname" and value.strip():
            return value.strip()
    return node.address
