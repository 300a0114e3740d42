"""The collective surface HiCache needs from the distributed layer; ours, no upstream twin.

`parallel_state.py` implements it over gloo groups. HiRadixCache and the controller only see this
Protocol, so unit tests can drive them with a fake, and the scheduler passes the real one.
"""

from __future__ import annotations

from typing import Protocol

import torch

# Dedicated gloo groups, created collectively by every rank at init in this order.
THREAD_GROUPS = ("prefetch_hits", "prefetch_completion")


class HiCacheComm(Protocol):
    pp_rank: int
    pp_size: int
    tp_rank: int
    tp_size: int

    def all_reduce_tp(self, tensor: torch.Tensor, op: str = "min") -> None:
        """In-place all-reduce over this stage's TP gloo group (no-op when tp_size == 1).
        `op` is "min", "max" or "sum". Mirrors `_all_reduce_attn_groups`."""

    def all_reduce_pp(self, tensor: torch.Tensor, op: str = "min") -> None:
        """Symmetric in-place all-reduce over every rank (all PP stages and TP ranks).
        Used for the host-capacity MIN (#29258) and two-phase host alloc (#31425)."""

    def pp_sync(self, tensor: torch.Tensor) -> None:
        """Mirrors `_pp_sync`: PP>0 blocks in recv from the previous stage (tag HIRADIX_PP_SYNC),
        then every non-last stage isends a clone to the next stage and keeps the work handle.
        Not a collective: PP0 never waits here."""

    def drain_async_work(self) -> None:
        """Mirrors `_drain_async_work` (#28916): wait on every kept isend, then forget them."""

    def all_reduce_thread_group(self, name: str, tensor: torch.Tensor, op: str = "min") -> None:
        """In-place all-reduce over every rank on a dedicated gloo group reserved for one
        background thread (`THREAD_GROUPS`). Two threads never share one communicator
        (upstream #27010): each storage thread calls only its own group."""

    def inflight_sends(self) -> int:
        """Number of kept isend handles (the #28902 leak grows this without bound)."""
