"""manifest.json and budget.json's records (docs/evidence.md). The manifest's top-level keys are
typed; what each engine puts under `config` (its run options) and `sglang` (the release) stays a
mapping, read by that engine's own code."""

from __future__ import annotations

import platform
import socket
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from hicache_diag.evidence.clean_state import WarmServerRecord
from hicache_diag.evidence.layout import EVIDENCE_VERSION
from hicache_diag.evidence.record import Record


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


@dataclass(frozen=True, slots=True)
class TopologyRank(Record):
    rank: int = 0
    pp: int = 0
    tp: int = 0


@dataclass(frozen=True, slots=True)
class Topology(Record):
    nested = {"ranks": TopologyRank}

    pp: int = 1
    tp: int = 1
    world_size: int = 1
    ranks: list[TopologyRank] = field(default_factory=list)


# The keys every engine's manifest has (docs/evidence.md), written first.
HEAD_KEYS = ("tool", "version", "evidence_version", "python", "host", "argv", "started_at")


@dataclass(frozen=True, slots=True)
class Manifest(Record):
    """manifest.json. `evidence_version` 0: a run from before the evidence was versioned;
    `engine` None: the builtin runtime (only the sglang engine writes the key)."""

    nested = {"topology": Topology, "warm_server": WarmServerRecord}

    tool: str = "hicache-diag"
    version: str = ""
    evidence_version: int = 0
    python: str = ""
    torch: str | None = None
    host: str = ""
    argv: list[str] = field(default_factory=list)
    seed: int | None = None
    config: dict[str, Any] = field(default_factory=dict)  # the engine's run options, as written
    protocol: dict[str, str] | None = field(default_factory=dict)  # switch -> mode (sglang: null)
    faults: list[str] = field(default_factory=list)  # spec strings
    topology: Topology | None = None
    engine: str | None = None
    # The device the run ran on: "cpu" or "cuda" (None: a run from before the key; `ran_on`).
    device: str | None = None
    sglang: dict[str, Any] | None = None  # the release: version, python, argv, torch, cuda, ...
    notes: list[str] = field(default_factory=list)  # how the sglang engine adapted the launch
    started_at: str = ""
    # The sglang engine's warm server: reused or restarted, with each rank's clean-state proof.
    warm_server: WarmServerRecord | None = None

    @classmethod
    def head(cls, argv: list[str] | None, version: str) -> Manifest:
        """The head every engine's manifest starts with; the other keys are the engine's."""
        return cls(
            version=version,
            evidence_version=EVIDENCE_VERSION,
            python=platform.python_version(),
            host=socket.gethostname(),
            argv=list(argv) if argv else list(sys.argv),
            started_at=utc_now(),
            absent=frozenset(cls.keys()) - frozenset(HEAD_KEYS),
        )

    @property
    def ran_on(self) -> str | None:
        """The device the run ran on; for a manifest from before the `device` key, what its
        config says (the sglang engine's launch `spec.cpu`, the builtin's `server_args.device`)."""
        if self.device:
            return self.device
        spec = self.config.get("spec")
        if isinstance(spec, dict) and isinstance(spec.get("cpu"), bool):
            return "cpu" if spec["cpu"] else "cuda"
        args = self.config.get("server_args")
        if isinstance(args, dict) and args.get("device") in ("cpu", "cuda"):
            return args["device"]
        return None

    @property
    def tp_size(self) -> int:
        return int(self.topology.tp or 1) if self.topology else 1

    @property
    def topology_ranks(self) -> list[TopologyRank]:
        return list(self.topology.ranks) if self.topology else []


@dataclass(frozen=True, slots=True)
class Budget(Record):
    """budget.json: PP0 stopped on the step budget (`--max-steps`) with requests unfinished."""

    max_steps: int | None = None
    steps: int | None = None
    unfinished_requests: int | None = None
