"""The L2 consensus half of HiRadixCache: how many acks to consume (ack counting) and the
two-phase host alloc; ours.

Upstream writes these inline in hiradix_cache.py; they live apart here because each is one
protocol switch of docs/design.md §2 (`ack-count`, `tp-collective`, `host-alloc`). SGLang's own
methods that call them (`check_hicache_events`, `writing_check`, `loading_check`) are in
hiradix_cache.py, where upstream has them.

Where collectives may run: ① (`check_hicache_events`) and ② (admission, eviction) are reached by
every stage without waiting on a later send of a peer, but ④ (`process_batch_result`, where
inserts trigger `write_backup`) is not: PP0 sends its proxy only after ④ while PP1 waits for it
in ③. Symmetric collectives inside the loop deadlock: PPn finishes step s only after PP0's exchange
of a later step. So the two-phase host alloc votes asynchronously: nodes queued at ④ are
reserved and put to an async MIN at the next ①, which is waited for `vote_delay` (= pp_loop_size)
①s later, when every stage has surely issued it. write_back victims (evicted at ②) go to the
same vote and stay on device until it is decided (`defer_write_back`); the L3 prefetch slots have
a vote of their own (l3_host_alloc).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from hicache_diag.engines.builtin.runtime.mem_cache.radix_cache import TreeNode

VOTE_WIDTH = 32  # nodes decided per vote; more wait for the next ①


class L2ProtocolMixin:
    """Mixed into HiRadixCache; uses its tree, controller, host pool, comm and protocol."""

    def _ack_queue(self, kind: str) -> list:
        c = self.cache_controller
        return c.ack_write_queue if kind == "write" else c.ack_load_queue

    def _ready_prefix(self, kind: str) -> int:
        n = 0
        queue = self._ack_queue(kind)
        for ack in queue:
            if not ack.finish_event.query():
                break
            n += 1
        self.acks_ready[kind] = n
        # How long the first not-ready ack has been in flight: whatever the stage's position in
        # the loop, a slow copy engine shows as old pending acks (the dma-ack-count culprit).
        if n < len(queue):
            age_ms = (time.monotonic() - queue[n].issued_at) * 1e3
            self.ack_pending_ms[kind] = max(self.ack_pending_ms.get(kind, 0.0), round(age_ms, 3))
        return n

    def _agree_counts(self, kinds: tuple[str, ...]) -> list[int]:
        """How many acks of each kind to consume now, per the `ack-count` switch."""
        ready = [self._ready_prefix(k) for k in kinds]
        local = self.protocol.ack_count == "local"
        decides = local or self.comm.pp_rank == 0
        counts = torch.tensor(ready if decides else [0] * len(kinds), dtype=torch.int64)
        if decides:
            self._all_reduce_tp(counts, empty=all(not self._ack_queue(k) for k in kinds))
        if not local:
            self.comm.pp_sync(counts)  # #27285: PP0 decides, the chain relays
            received = self.sync_received.setdefault("ack_count", {})
            received.update(zip(kinds, counts.tolist(), strict=True))
        return counts.tolist()

    def _all_reduce_tp(self, counts: torch.Tensor, empty: bool) -> None:
        if empty and self.protocol.tp_collective == "conditional":
            self.tp_allreduce_skipped += 1  # #28429: a TP peer with acks now waits forever
            return
        self.comm.all_reduce_tp(counts, "min")

    # ---- two-phase host alloc (#31425) ------------------------------------------------------
    def request_backup(self, node: TreeNode) -> int:
        """write_backup at ④ under two-phase: lock the node and queue it for the next vote."""
        if node.id not in self.pending_backup:
            self.pending_backup[node.id] = node
            self._queued_backup.append(node)
            self.inc_lock_ref(node)  # its device value must survive until the decision
        return 0

    def defer_write_back(self, node: TreeNode) -> bool:
        """write_back eviction (at ②) under two-phase: it can neither wait for a vote nor run a
        collective there (PP0 relaying its own alloc left a follower whose alloc failed unable to
        obey). So the victim is queued for the next vote, locked meanwhile, and a later eviction
        demotes it once its agreed copy is acked; one the vote refused is deleted, on every
        rank alike. False: evict it now (delete)."""
        if node.id in self.write_back_refused or not self._eligible(node):
            return False
        self.request_backup(node)
        return True

    def commit_pending_backups(self) -> None:
        """Issue this ①'s vote, then apply the one issued `vote_delay` ①s ago. Every rank issues
        exactly one vote per ①, so the collectives pair up by order whatever the timing."""
        self._votes.append(self._issue_vote())
        if len(self._votes) > self.vote_delay:
            self._apply_vote(self._votes.popleft())

    def _issue_vote(self) -> HostAllocVote:
        batch = self._queued_backup[:VOTE_WIDTH]
        self._queued_backup = self._queued_backup[VOTE_WIDTH:]
        eligible = [self._eligible(n) for n in batch]
        reserved = [
            self.mem_pool_host.alloc(len(n.key)) if ok else None
            for n, ok in zip(batch, eligible, strict=True)
        ]
        vote = min_vote_tensor([int(r is not None) for r in reserved], VOTE_WIDTH)
        return HostAllocVote(batch, eligible, reserved, vote, self._all_reduce_pp_async(vote))

    def _eligible(self, node: TreeNode) -> bool:
        """A node may be backed up if its parent is, or is itself on the way to be."""
        parent = node.parent
        ok = parent is self.root_node or parent.backuped or parent.id in self.pending_backup
        return ok and not node.backuped and not node.evicted

    def _apply_vote(self, vote: HostAllocVote) -> None:
        agreed = self._agreed_flags("host_alloc", vote.tensor, vote.work, len(vote.nodes))
        for node, ok, host, yes in zip(
            vote.nodes, vote.eligible, vote.reserved, agreed, strict=False
        ):
            del self.pending_backup[node.id]
            self.dec_lock_ref(node)
            if yes and (node.parent is self.root_node or node.parent.backuped):
                self._commit_backup(node, host)
                continue
            if host is not None:
                self.mem_pool_host.free(host)  # abort: some rank could not reserve
            if ok:
                self.host_alloc_failed += 1
                self.evict_host(len(node.key))  # every rank makes room the same way
                if self.write_policy == "write_back":
                    self.write_back_refused.add(node.id)

    def _agreed_flags(self, key: str, tensor: torch.Tensor, work: Any, n: int) -> list[int]:
        """Wait for a vote's MIN; its agreed flags, the first `n` (this rank's entries) kept in
        `sync_received[key]` whenever some rank voted."""
        if work is not None:
            work.wait()
        agreed = tensor[2:].tolist()
        if n or tensor[1] != 0:
            self.sync_received.setdefault(key, []).extend(agreed[:n])
        return agreed

    def _all_reduce_pp_async(self, tensor: torch.Tensor) -> Any:
        """The vote's MIN over every rank, waited for `vote_delay` ①s later. A blocking
        collective here would deadlock: PPn finishes a step only after PP0's next exchange."""
        start = getattr(self.comm, "all_reduce_pp_async", None)
        if start is not None:
            return start(tensor, "min")
        group = getattr(self.comm, "world_group", None)
        if group is not None and dist.is_available() and dist.is_initialized():
            return dist.all_reduce(tensor, op=dist.ReduceOp.MIN, group=group, async_op=True)
        self.comm.all_reduce_pp(tensor, "min")  # fakes and single-process use
        return None

    def reserved_host_tokens(self) -> int:
        """Host slots held by undecided votes, write_backup's and the L3 prefetches'."""
        held = sum(len(r) for v in self._votes for r in v.reserved if r is not None)
        return held + self.prefetch_reserved_tokens()

    def _commit_backup(self, node: TreeNode, host: torch.Tensor) -> None:
        tag = {"ancestor_ids": self._ancestor_ids(node), "write_back": False}
        self.cache_controller.write(node.value, node.id, host, tag)
        node.host_value = host.clone()
        self.ongoing_write_through[node.id] = node
        self.inc_lock_ref(node)
        self.write_backs += len(node.key)


def min_vote_tensor(flags: list[int], width: int) -> torch.Tensor:
    """A vote `[n, -n, flags..., 0...]`: its MIN is (min n, -max n, agreed flags); missing
    entries stay 0, so a rank that queued fewer aborts the surplus on every rank instead of
    mismatching shapes."""
    n = len(flags)
    return torch.tensor([n, -n, *flags, *[0] * (width - n)], dtype=torch.int64)


@dataclass
class HostAllocVote:
    nodes: list
    eligible: list[bool]
    reserved: list
    tensor: torch.Tensor
    work: Any
