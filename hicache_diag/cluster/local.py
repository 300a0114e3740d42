"""The local executor: this machine's own python3, N collectors (1 for triage; the bench
starts more to measure the fan-out itself)."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from hicache_diag.cluster.base import Executor, Node


@dataclass(slots=True)
class LocalExecutor(Executor):
    def __post_init__(self) -> None:
        self.name = "local"
        self.nodes = self.nodes or [Node("local", "localhost")]

    def argv(self, node: Node, remote: list[str]) -> list[str]:
        # `python3 -` here is this interpreter: the same stdlib-only collector either way.
        return [sys.executable, *remote[1:]]
