"""Mirrors sglang/srt/managers/io_struct.py: what travels from PP0 down the chain each slot."""

from __future__ import annotations

from dataclasses import dataclass, field

# One request record for both engines: the workload makes it (hicache_diag/options/workloads.py).
from hicache_diag.options.workloads import TokenizedGenerateReqInput

__all__ = ["RecvReqs", "TokenizedGenerateReqInput"]


@dataclass(frozen=True, slots=True)
class RecvReqs:
    """One slot's `recv_reqs`: new requests, and PP0's decision to stop after this slot (every
    stage stops in the same slot, so no send is left without its recv)."""

    reqs: tuple[TokenizedGenerateReqInput, ...] = field(default_factory=tuple)
    stop: bool = False
