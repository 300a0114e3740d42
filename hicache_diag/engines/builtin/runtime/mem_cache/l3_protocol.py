"""The L3 half of HiRadixCache: prefetch from storage, its progress, and backups; ours as a mixin.

Upstream keeps these in hiradix_cache.py with the same names (`prefetch_from_storage`,
`check_prefetch_progress`, `drain_storage_control_queues`, `write_backup_storage`,
`_insert_helper_host`). The two L3 switches of docs/design.md §2 act here and in the controller:
- `l3-hit=min`: the prefetch thread MINs the hit count; the control queues are drained by PP0's
  counts, relayed with `pp_sync` (the controller's `drain_storage_control_queues`).
- `l3-progress=min`: the sync thread MINs the progress, and PP0 decides which prefetches stop,
  relayed at ① in one fixed-width `pp_sync`, so `check_prefetch_progress` in the waiting-queue
  loop runs no collective whose call count depends on admission (#30760).
Legacy (`local`): each rank stops a prefetch from its own progress and its own clock.
The host slots of the reads follow the `host-alloc` switch (l3_host_alloc).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from hicache_diag.engines.builtin.runtime.managers.storage_operation import PrefetchOperation
from hicache_diag.engines.builtin.runtime.mem_cache.hicache_storage import get_page_hashes
from hicache_diag.engines.builtin.runtime.mem_cache.l3_host_alloc import L3HostAllocMixin
from hicache_diag.engines.builtin.runtime.mem_cache.radix_cache import TreeNode

if TYPE_CHECKING:
    from hicache_diag.engines.builtin.runtime.managers.storage_controller import StorageController

# SGLang's prefetch_threshold is 256 tokens for real models; our prompts are ~64 tokens.
PREFETCH_THRESHOLD_PAGES = 2
DECISION_WIDTH = 32  # prefetches decided per relay; more wait for the next ①


@dataclass
class OngoingPrefetch:
    """`anchor`: the host node the fetched pages hang under (protected until the end)."""

    anchor: TreeNode
    token_ids: list[int]
    operation: PrefetchOperation


class L3ProtocolMixin(L3HostAllocMixin):
    """Mixed into HiRadixCache; scheduler thread only. The storage threads never touch the tree."""

    def _init_storage(self, storage_controller: StorageController | None) -> None:
        self.storage_controller = storage_controller
        self.enable_storage = storage_controller is not None
        self.prefetch_threshold = PREFETCH_THRESHOLD_PAGES * self.page_size
        self.ongoing_prefetch: dict[str, OngoingPrefetch] = {}
        self.ongoing_backup: dict[int, Any] = {}
        self.prefetch_stop: set[str] = set()  # PP0's relayed decisions (l3-progress=min)
        self._io_tails: list[tuple[PrefetchOperation, torch.Tensor]] = []
        self.l3_inserted = 0
        self._init_prefetch_alloc()

    @property
    def _relay_progress(self) -> bool:
        return self.protocol.mode("l3-progress") == "min"

    # ---- request arrival --------------------------------------------------------------------
    def prefetch_from_storage(self, req_id: str, token_ids: list[int]) -> bool:
        """Start an L3 prefetch of what the tree lacks of `token_ids`; False when skipped (no
        storage, under the threshold, rate limited, or the match ends on a node with no host
        copy: fetched pages must hang under a host node so the host tree stays contiguous)."""
        ctrl = self.storage_controller
        if not self.enable_storage or req_id in self.ongoing_prefetch:
            return False
        key = token_ids[: len(token_ids) // self.page_size * self.page_size]
        anchor = self.match_prefix(key).last_host_node
        if anchor is not self.root_node and not anchor.backuped:
            return False
        prefix = self._path_tokens(anchor)
        new_tokens = key[len(prefix) :]
        if len(new_tokens) < self.prefetch_threshold or ctrl.prefetch_rate_limited():
            return False
        last_hash = get_page_hashes(prefix, self.page_size)[-1] if prefix else None
        anchor.host_ref_counter += 1  # protect_host: evict_host skips it until the end
        operation = ctrl.prefetch(req_id, new_tokens, last_hash)
        self.ongoing_prefetch[req_id] = OngoingPrefetch(anchor, new_tokens, operation)
        ctrl.prefetch_tokens_occupied += len(new_tokens)
        return True

    def _path_tokens(self, node: TreeNode) -> list[int]:
        keys = []
        while node is not None and node is not self.root_node:
            keys.append(node.key)
            node = node.parent
        return [t for k in reversed(keys) for t in k]

    # ---- ① ----------------------------------------------------------------------------------
    def check_storage_events(self) -> None:
        """After the L2 ack checks, at the same point on every rank: drain the storage control
        queues by agreed counts, then (l3-progress=min) relay PP0's stop decisions."""
        if not self.enable_storage:
            return
        drained = self.storage_controller.drain_storage_control_queues()
        for operation in drained["prefetch_hit_queue"]:
            self._on_storage_hit(operation)
        for operation in drained["ack_backup_queue"]:
            node = self.ongoing_backup.pop(operation.id, None)
            if node is not None:
                node.host_ref_counter -= 1  # release_host: the pages are in L3 now
        self._free_io_tails()
        if self.prefetch_two_phase:
            self.vote_prefetch_allocs()  # every ①, even when empty: the votes pair by order
        if self._relay_progress:
            self._relay_prefetch_decisions()

    def _on_storage_hit(self, operation: PrefetchOperation) -> None:
        """An agreed hit count arrived: get host slots for it (lazily, as #19320 does; agreed
        per `host-alloc`, see l3_host_alloc) and start the reads, or revoke it under the
        threshold."""
        entry = self.ongoing_prefetch.get(operation.request_id)
        if entry is None or entry.operation is not operation or operation.is_terminated():
            return  # already stopped (best_effort) before its hit count came
        if operation.storage_hit_count < self.prefetch_threshold:
            self._end_prefetch(operation.request_id)
            return
        self.alloc_prefetch(operation)

    def _relay_prefetch_decisions(self) -> None:
        """PP0 decides (MIN over its TP: stop only if every TP rank may), the chain obeys."""
        rids = [r for r in self.ongoing_prefetch if r not in self.prefetch_stop][:DECISION_WIDTH]
        flags = [0] * DECISION_WIDTH
        if self.comm.pp_rank == 0:
            for i, rid in enumerate(rids):
                op = self.ongoing_prefetch[rid].operation
                flags[i] = int(self.storage_controller.can_terminate_prefetch(op))
        vec = torch.tensor([len(rids), *flags], dtype=torch.int64)
        if self.comm.pp_rank == 0:
            self.comm.all_reduce_tp(vec, "min")
        self.comm.pp_sync(vec)
        n = int(vec[0])
        self.prefetch_stop.update(r for r, f in zip(rids[:n], vec[1:].tolist(), strict=False) if f)
        if n:
            self.sync_received["l3_stop"] = vec[1 : 1 + n].tolist()

    # ---- ② waiting-queue loop ---------------------------------------------------------------
    def check_prefetch_progress(self, req_id: str) -> bool:
        """True when the request may be scheduled: no prefetch, or it stopped now and its
        pages went into the host tree. False: keep it waiting (the policy says not yet)."""
        entry = self.ongoing_prefetch.get(req_id)
        if entry is None:
            return True
        if self._relay_progress:
            if req_id not in self.prefetch_stop:
                return False
        elif not self._local_can_terminate(entry.operation):
            return False
        self.prefetch_stop.discard(req_id)
        self._finish_prefetch(req_id)
        return True

    def _local_can_terminate(self, operation: PrefetchOperation) -> bool:
        """Legacy: this rank's progress and clock; TP-reduced only (HiRadixCache's MAX of
        "cannot stop"), inside the waiting loop, as upstream did before #30760's fixes."""
        can = torch.tensor([int(self.storage_controller.can_terminate_prefetch(operation))])
        self.comm.all_reduce_tp(can, "min")
        return bool(can.item())

    def _finish_prefetch(self, req_id: str) -> None:
        """Stop the prefetch and insert the agreed completed pages under the anchor."""
        entry = self.ongoing_prefetch[req_id]
        op = entry.operation
        completed, _ = self.storage_controller.terminate_prefetch(op)
        if op.host_indices is not None:
            completed = min(completed, len(op.host_indices))
            fetched = entry.token_ids[:completed]
            self.l3_inserted += self._insert_helper_host(
                entry.anchor, fetched, op.host_indices[:completed]
            )
        self._end_prefetch(req_id, completed if op.host_indices is not None else 0)

    def _end_prefetch(self, req_id: str, used: int = 0) -> None:
        """Forget the prefetch: unprotect the anchor, return its reservation, and keep host slots
        past `used` until the IO thread is done with the operation."""
        entry = self.ongoing_prefetch.pop(req_id)
        op = entry.operation
        op.mark_terminate()
        self.prefetch_stop.discard(req_id)
        entry.anchor.host_ref_counter -= 1
        self.storage_controller.prefetch_tokens_occupied -= len(entry.token_ids)
        if op.host_indices is not None and used < len(op.host_indices):
            self._io_tails.append((op, op.host_indices[used:]))

    def _free_io_tails(self) -> None:
        """Slots past the agreed progress go back once the completion ack was consumed (an agreed
        count), so ranks free them at the same step and no late read lands in a reused slot."""
        keep = []
        for op, tail in self._io_tails:
            if op.io_done:
                self.mem_pool_host.free(tail)
            else:
                keep.append((op, tail))
        self._io_tails = keep

    def _insert_helper_host(
        self, anchor: TreeNode, key: list[int], host_indices: torch.Tensor
    ) -> int:
        """Hang fetched pages under `anchor` as host-only nodes; slots of pages the tree already
        holds on host are freed. Stops at a node with no host copy. Returns tokens inserted."""
        node = anchor
        while key:
            child = node.children.get(self._page_key(key))
            if child is None:
                new = TreeNode(self._new_id(), node, list(key))
                new.host_value = host_indices.clone()
                node.children[self._page_key(key)] = new
                self._stamp(new)
                return len(key)
            plen = self._match_len(child.key, key)
            if plen < len(child.key):
                child = self._split_node(child, plen)
            if not child.backuped:
                break
            self.mem_pool_host.free(host_indices[:plen])
            node, key, host_indices = child, key[plen:], host_indices[plen:]
        if len(host_indices):
            self.mem_pool_host.free(host_indices)
        return 0

    def _split_node(self, child: TreeNode, split_len: int) -> TreeNode:
        new = super()._split_node(child, split_len)
        # host protection (prefetch anchor, backup, load) stays on the lower node: evict_host
        # takes leaves only, so the upper part is safe while the lower one is protected
        new.host_ref_counter = 0
        return new

    # ---- backup -----------------------------------------------------------------------------
    def write_backup_storage(self, node: TreeNode) -> None:
        """After a write-through ack: copy the node's host pages to L3, host-protected until the
        backup ack is drained."""
        if not self.enable_storage or node.host_value is None:
            return
        pages = len(node.key) // self.page_size
        hashes = get_page_hashes(self._path_tokens(node), self.page_size)[-pages:]
        op_id = self.storage_controller.write_storage(node.host_value, list(node.key), hashes)
        node.host_ref_counter += 1
        self.ongoing_backup[op_id] = node

    # ---- evidence ---------------------------------------------------------------------------
    def storage_held_tokens(self) -> int:
        """Host slots that storage holds outside the tree (fetching, or waiting to be freed)."""
        if not self.enable_storage:
            return 0
        held = sum(
            len(e.operation.host_indices)
            for e in self.ongoing_prefetch.values()
            if e.operation.host_indices is not None
        )
        held += sum(len(t) for _, t in self._io_tails)
        return held + self.storage_controller.host_mem_release_queue.qsize() * self.page_size

    def storage_probe_stats(self, stats: dict[str, Any]) -> None:
        """Merge this step's L3 evidence (docs/evidence.md) into the tree's probe stats."""
        if not self.enable_storage:
            return
        ctrl = self.storage_controller
        stats.update(ctrl.drain_step_evidence())
        stats["queues"] = {**stats.get("queues", {}), **ctrl.storage_queue_sizes()}
        stats["l3_inserted"] = self.l3_inserted
        stats["prefetch_tokens_occupied"] = ctrl.prefetch_tokens_occupied
        stats["ongoing_prefetch"] = len(self.ongoing_prefetch)
        self.l3_inserted = 0
