"""A warm SGLang server's trial boundary (docs/evidence.md): each rank's clean-state proof,
`clean_state/rank{r}.json`, written by our plugin inside that rank from the facts it read off
SGLang's own objects, and the manifest's `warm_server` record, written by the harness after it
compared every rank's proof with the fresh server's. Standard library only (the plugin imports
it inside SGLang)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hicache_diag.evidence.record import Record

CLEAN_STATE = "clean_state"
UNKNOWN = "unknown"  # a fact this release does not expose: never read as clean


def clean_state_json(run_dir: Path | str, rank: int) -> Path:
    return Path(run_dir) / CLEAN_STATE / f"rank{rank}.json"


@dataclass(frozen=True, slots=True)
class CleanStateProof(Record):
    """What rank `rank` read at boundary `seq` (the harness's request number): `facts` are
    compared with the fresh server's (a value or "unknown"), `info` only recorded (a clock's
    phase, the RNG seed it re-seeded)."""

    seq: int = 0
    rank: int = 0
    step: int = 0  # the rank's step counter when it read them: its next line is this trial's
    t: float = 0.0
    facts: dict[str, Any] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class WarmServerRecord(Record):
    """manifest.json `warm_server`: whether this trial runs on the server the previous trial
    left (`reused`), why (or why it was restarted), which trial of that server it is (0: the
    server was started for it), the proofs by rank ("0", "1", ...) and the fresh server's they
    were compared with, every difference, and how long the boundary took. `second_look`: the
    first look after /flush_cache differed (a later PP stage may still be flushing), so the
    decision is the second one's; `first_look` keeps what the first saw (`proof` by rank and
    `differences`)."""

    reused: bool = False
    why: str = ""
    server_trial: int = 0
    server_pid: int | None = None
    boundary_s: float | None = None
    proof: dict[str, Any] = field(default_factory=dict)
    fresh: dict[str, Any] = field(default_factory=dict)
    differences: list[str] = field(default_factory=list)
    second_look: bool = False
    first_look: dict[str, Any] = field(default_factory=dict)
