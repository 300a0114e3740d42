"""The kubectl executor: `kubectl exec -i POD -- python3 - ARGS` per pod, pods by label
selector (`kubectl get pods -l SEL`) or by name. Never ran against a cluster here (none can
run on this machine): its commands and the parsing of kubectl's real output are tested."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

from hicache_diag.cluster.base import Executor, Node
from hicache_diag.errors import UsageError


def parse_pods(table: str) -> list[tuple[str, str]]:
    """`kubectl get pods` table -> (name, status) per pod. Columns by header, so -o wide,
    --all-namespaces (NAMESPACE first) and `pod/NAME` rows read the same; STATUS comes before
    the columns whose cells hold spaces (RESTARTS `2 (3m52s ago)`, NOMINATED NODE)."""
    lines = [ln for ln in table.splitlines() if ln.strip()]
    head = lines[0].split() if lines else []
    if "NAME" not in head or "STATUS" not in head:
        return []
    name_at, status_at = head.index("NAME"), head.index("STATUS")
    rows = [ln.split() for ln in lines[1:]]
    return [(r[name_at].removeprefix("pod/"), r[status_at]) for r in rows if len(r) > status_at]


@dataclass(slots=True)
class KubectlExecutor(Executor):
    selector: str | None = None
    namespace: str | None = None
    container: str | None = None

    def __post_init__(self) -> None:
        self.name = "kubectl"
        if not self.selector and not self.nodes:
            raise UsageError("--via kubectl needs --selector LABEL=VALUE or --hosts POD[,POD...]")

    def _ns(self) -> list[str]:
        return ["-n", self.namespace] if self.namespace else []

    def get_pods_argv(self) -> list[str]:
        return ["kubectl", "get", "pods", *self._ns(), "-l", str(self.selector)]

    def resolve(self) -> list[Node]:
        if not self.selector:
            return self.nodes  # pod names given: a missing one is named by kubectl exec
        if shutil.which("kubectl") is None:
            raise UsageError("--via kubectl: kubectl not found on PATH")
        try:
            done = subprocess.run(self.get_pods_argv(), capture_output=True, text=True, timeout=20)
        except subprocess.TimeoutExpired:
            raise UsageError("--via kubectl: the API server did not answer in 20 s") from None
        return self.pods_from(done.returncode, done.stdout, done.stderr)

    def pods_from(self, returncode: int, stdout: str, stderr: str) -> list[Node]:
        err = (stderr.strip().splitlines() or [""])[-1]
        if returncode != 0:
            raise UsageError(f"--via kubectl: {err or f'kubectl exited {returncode}'}")
        pods = parse_pods(stdout)
        running = [name for name, status in pods if status == "Running"]
        if not running:
            seen = ", ".join(f"{n} {s}" for n, s in pods) or err or "no pods"
            raise UsageError(f"--selector {self.selector}: no running pod ({seen})")
        return [Node(p, p) for p in running]

    def argv(self, node: Node, remote: list[str]) -> list[str]:
        container = ["-c", self.container] if self.container else []
        return ["kubectl", "exec", "-i", *self._ns(), node.address, *container, "--", *remote]

    def explain(self, node: Node, returncode: int | None, stderr: str) -> str:
        lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
        err = lines[-1] if lines else f"exit status {returncode}"
        if "NotFound" in err:
            return f"kubectl {node.address}: pod not found"
        if "python3" in err and ("not found" in err or "no such file" in err):
            return f"kubectl {node.address}: no python3 in the container"
        return f"kubectl {node.address}: {err}"
