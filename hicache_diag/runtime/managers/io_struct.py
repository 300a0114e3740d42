"""Mirrors sglang/srt/managers/io_struct.py: what travels from PP0 down the chain each slot."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class TokenizedGenerateReqInput:
    rid: str
    input_ids: tuple[int, ...]
    max_new_tokens: int


@dataclass(frozen=True, slots=True)
class RecvReqs:
    """One slot's `recv_reqs`: new requests, and PP0's decision to stop after this slot (every
    stage stops in the same slot, so no send is left without its recv)."""

    reqs: tuple[TokenizedGenerateReqInput, ...] = field(default_factory=tuple)
    stop: bool = False
