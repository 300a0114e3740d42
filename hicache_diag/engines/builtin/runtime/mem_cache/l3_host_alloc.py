"""Host slots for L3 prefetch reads, per the `host-alloc` switch; ours, a mixin of HiRadixCache.

The agreed hit count of a prefetch reaches every rank at the same ① (`l3-hit=min` relays the
drain counts), but whether the host pool can hold the pages is a local fact (a host-alloc-fail
fault, a pool that drifted). The `host-alloc` switch that governs write_backup (#31425) governs
this allocation too:
- `local` (legacy): each rank allocates when the hit arrives (one evict_host and a retry); a
  rank that still fails revokes the prefetch alone, admits the request at once while its peers
  wait for the reads, and the stages build different batches: a hang or a crash (OPEN 1).
- `two-phase`: every rank reserves the slots at ① and puts success flags to an async MIN vote,
  applied `vote_delay` ①s later, as write_backup's vote (see l2_protocol for why it cannot
  block): commit (the reads start on every rank), or abort (every rank frees its reservation
  and makes room with the same evict_host; one more vote, then the prefetch is revoked
  everywhere). The vote is a collective of its own, issued once per ① on every rank, right
  after write_backup's, even when empty, so the two streams pair up by order on every rank;
  every queued prefetch takes a slot in exactly one vote per attempt (conservation).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

from hicache_diag.engines.builtin.runtime.managers.storage_operation import PrefetchOperation
from hicache_diag.engines.builtin.runtime.mem_cache.l2_protocol import min_vote_tensor

PREFETCH_VOTE_WIDTH = 16  # prefetches decided per vote; more wait for the next ①
MAX_ALLOC_ATTEMPTS = 2  # as the legacy path: alloc, evict_host, alloc again


@dataclass
class PrefetchAllocVote:
    """One ①'s prefetch vote: (operation, attempt) entries, this rank's reservations, the MIN
    tensor `[n, -n, flags...]` and the async work to wait for."""

    entries: list[tuple[PrefetchOperation, int]]
    reserved: list[torch.Tensor | None]
    tensor: torch.Tensor
    work: Any


class L3HostAllocMixin:
    """Scheduler thread only. Uses the tree's host pool, storage controller, protocol, comm,
    `ongoing_prefetch`, `evict_host`, `_end_prefetch`, `_all_reduce_pp_async` and
    `_agreed_flags`."""

    def _init_prefetch_alloc(self) -> None:
        self.prefetch_two_phase = self.protocol.host_alloc == "two-phase"
        self._queued_prefetch: list[tuple[PrefetchOperation, int]] = []
        self._prefetch_votes: deque[PrefetchAllocVote] = deque()

    def alloc_prefetch(self, operation: PrefetchOperation) -> None:
        """The agreed hit passed the threshold: give its reads host slots (or revoke it)."""
        if self.prefetch_two_phase:
            self._queued_prefetch.append((operation, 0))
            return
        ctrl = self.storage_controller
        if ctrl.submit_prefetch_io(operation):
            return
        self.evict_host(operation.storage_hit_count)
        if not ctrl.submit_prefetch_io(operation):
            self.host_alloc_failed += 1
            self._end_prefetch(operation.request_id)  # on this rank only: the divergence

    def vote_prefetch_allocs(self) -> None:
        """At every ① with storage on and two-phase: issue this ①'s vote, then apply the one
        issued `vote_delay` ①s ago."""
        self._prefetch_votes.append(self._issue_prefetch_vote())
        if len(self._prefetch_votes) > self.vote_delay:
            self._apply_prefetch_vote(self._prefetch_votes.popleft())

    def _prefetch_live(self, operation: PrefetchOperation) -> bool:
        entry = self.ongoing_prefetch.get(operation.request_id)
        return entry is not None and entry.operation is operation and not operation.is_terminated()

    def _issue_prefetch_vote(self) -> PrefetchAllocVote:
        entries = self._queued_prefetch[:PREFETCH_VOTE_WIDTH]
        self._queued_prefetch = self._queued_prefetch[PREFETCH_VOTE_WIDTH:]
        reserved = [
            self.mem_pool_host.alloc(op.storage_hit_count) if self._prefetch_live(op) else None
            for op, _ in entries
        ]
        tensor = min_vote_tensor([int(r is not None) for r in reserved], PREFETCH_VOTE_WIDTH)
        return PrefetchAllocVote(entries, reserved, tensor, self._all_reduce_pp_async(tensor))

    def _apply_prefetch_vote(self, vote: PrefetchAllocVote) -> None:
        agreed = self._agreed_flags("prefetch_alloc", vote.tensor, vote.work, len(vote.entries))
        for (op, attempt), host, yes in zip(vote.entries, vote.reserved, agreed, strict=False):
            live = self._prefetch_live(op)
            if yes and live and host is not None:
                self.storage_controller.submit_prefetch_io(op, host)
                continue
            if host is not None:
                self.mem_pool_host.free(host)  # abort: some rank could not reserve
            if live:
                self._abort_prefetch_alloc(op, attempt + 1)

    def _abort_prefetch_alloc(self, operation: PrefetchOperation, attempts: int) -> None:
        """Every rank takes the same path here: the vote's outcome is the same everywhere."""
        self.host_alloc_failed += 1
        if attempts >= MAX_ALLOC_ATTEMPTS:
            self._end_prefetch(operation.request_id)
            return
        self.evict_host(operation.storage_hit_count)
        self._queued_prefetch.append((operation, attempts))

    def prefetch_reserved_tokens(self) -> int:
        """Host slots reserved by undecided prefetch votes (they count as free in `host_free`:
        a rank whose reservation failed holds none, and the ranks agree once it is decided)."""
        return sum(len(r) for v in self._prefetch_votes for r in v.reserved if r is not None)
