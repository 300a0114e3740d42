"""Real sshd "nodes" for multi-node tests: one OpenSSH server per loopback address
(127.0.0.2, 127.0.0.3, ...), each inside its own PID and mount namespace (`unshare --pid
--mount-proc`), so a collector that logs in sees only that node's processes, as on separate
machines. Generated host and user keys, and an ssh client config (`ssh -F`) naming the nodes
node-1, node-2, ... Needs root (sshd, unshare); installs openssh-server with apt when missing.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

SSHD = "/usr/sbin/sshd"
TESTS = Path(__file__).parent


def ensure_package(binary: str, package: str) -> None:
    """apt-get install `package` when `binary` is missing; skip (with the reason) when apt
    cannot run here."""
    if os.path.exists(binary) or shutil.which(binary):
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip(f"{binary} missing and apt-get cannot install {package} (needs root + apt)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", package]):
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
        if done.returncode != 0:
            pytest.skip(f"apt-get could not install {package}: {done.stderr.strip()[-200:]}")


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _wait_port(host: str, port: int, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            socket.create_connection((host, port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"sshd on {host}:{port} did not start")


@dataclass
class SshNode:
    name: str
    address: str
    port: int
    sshd_config: Path
    holder: subprocess.Popen | None = None  # `unshare ... sh`: pid 1 of the node's namespace
    started: list[subprocess.Popen] = field(default_factory=list)

    def start(self) -> None:
        # sh is the namespace's init, sshd its child: stopping sshd leaves the node's ranks up
        # (init then becomes a sleep: were it to exit, the namespace and its ranks would go).
        script = f"{SSHD} -D -e -f {self.sshd_config} & wait; exec sleep infinity"
        self.holder = subprocess.Popen(
            ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "sh", "-c", script],
            stdin=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait_port(self.address, self.port)

    def init_pid(self) -> int:
        """The host pid of the namespace's init (sh)."""
        return psutil.Process(self.holder.pid).children()[0].pid

    def stop_sshd(self) -> None:
        """sshd down, the node's processes still running."""
        for child in psutil.Process(self.init_pid()).children():
            if "sshd" in child.name():
                child.kill()
                child.wait(5)

    def spawn(self, argv: list[str]) -> subprocess.Popen:
        """A process inside this node's namespaces."""
        cmd = ["nsenter", "--target", str(self.init_pid()), "--pid", "--mount", *argv]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        self.started.append(proc)
        return proc

    def stop(self) -> None:
        if self.holder is not None and self.holder.poll() is None:
            # unshare ignores SIGTERM while it waits; killing the namespace's init ends every
            # process in it, then unshare returns.
            try:
                os.kill(self.init_pid(), signal.SIGKILL)
            except (IndexError, psutil.Error, ProcessLookupError):
                self.holder.kill()
            self.holder.wait(10)
        for proc in self.started:
            proc.wait(10)


@dataclass
class SshCluster:
    root: Path
    nodes: list[SshNode]
    client_config: Path

    def node(self, name: str) -> SshNode:
        return next(n for n in self.nodes if n.name == name)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


def _keys(root: Path) -> None:
    for name in ("host_key", "id_ed25519"):
        cmd = ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / name)]
        subprocess.run(cmd, check=True)
    shutil.copy(root / "id_ed25519.pub", root / "authorized_keys")


def node_path() -> str:
    """PATH on the nodes: the system python3, and the py-spy this test run has."""
    from hicache_diag.triage.pyspy import find_pyspy

    pyspy = find_pyspy()
    dirs = [os.path.dirname(os.path.realpath(pyspy))] if pyspy else []
    return ":".join([*dirs, "/usr/local/bin", "/usr/bin", "/bin"])


def _sshd_config(root: Path, name: str, address: str, port: int, path: str) -> Path:
    cfg = root / f"sshd_{name}.conf"
    cfg.write_text(
        f"ListenAddress {address}\nPort {port}\nHostKey {root / 'host_key'}\n"
        f"AuthorizedKeysFile {root / 'authorized_keys'}\nPidFile none\nStrictModes no\n"
        "UsePAM no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        f"PermitRootLogin prohibit-password\nLogLevel ERROR\n"
        # A bare node: our PATH, and a HOME of its own (the user's ~/.bashrc, run by bash
        # under sshd, would put its own tools on PATH).
        f"SetEnv PATH={path} HOME={root / 'home'}\n"
    )
    return cfg


def client_config(root: Path, nodes: list[SshNode], key: Path | None = None) -> Path:
    key = key or root / "id_ed25519"
    lines = []
    for n in nodes:
        lines += [f"Host {n.name}", f"  HostName {n.address}", f"  Port {n.port}"]
    lines += ["Host *", "  User root", f"  IdentityFile {key}", "  IdentitiesOnly yes"]
    lines += ["  StrictHostKeyChecking no", "  UserKnownHostsFile /dev/null", "  LogLevel ERROR"]
    path = root / f"ssh_config_{key.name}"
    path.write_text("\n".join(lines) + "\n")
    return path


def start_cluster(root: Path, count: int = 2, path: str | None = None) -> SshCluster:
    """`count` sshd nodes on 127.0.0.2.. in their own namespaces; the caller stops them."""
    if os.geteuid() != 0:
        pytest.skip("the sshd nodes need root (sshd, unshare --pid)")
    ensure_package(SSHD, "openssh-server")
    os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege separation directory
    _keys(root)
    (root / "home").mkdir(exist_ok=True)
    nodes = []
    for i in range(count):
        address = f"127.0.0.{i + 2}"
        port = _free_port(address)
        cfg = _sshd_config(root, f"node-{i + 1}", address, port, path or node_path())
        nodes.append(SshNode(f"node-{i + 1}", address, port, cfg))
    cluster = SshCluster(root, nodes, client_config(root, nodes))
    try:
        for node in nodes:
            node.start()
    except Exception:
        cluster.stop()
        raise
    return cluster


def start_pp_job(cluster: SshCluster, pp_size: int = 2) -> list[subprocess.Popen]:
    """PP rank p on node p+1 (SGLang's --node-rank), each READY before this returns."""
    port = _free_port("127.0.0.1")
    procs = []
    for p in range(pp_size):
        argv = [sys.executable, str(TESTS / "fake_rank.py"), "--node-rank", str(p)]
        argv += ["--pp", str(p), "--pp-size", str(pp_size), "--port", str(port)]
        proc = cluster.nodes[p].spawn(argv)
        assert proc.stdout.readline().strip() == "READY"
        procs.append(proc)
    return procs


def scheduler_pid(launcher: subprocess.Popen) -> int:
    """Host pid of the titled scheduler under nsenter -> launcher -> scheduler."""
    for child in psutil.Process(launcher.pid).children(recursive=True):
        if child.cmdline()[:1] and child.cmdline()[0].startswith("sglang::scheduler"):
            return child.pid
    raise RuntimeError("no scheduler child")
