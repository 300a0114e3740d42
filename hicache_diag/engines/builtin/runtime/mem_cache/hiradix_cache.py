"""Mirrors sglang/srt/mem_cache/hiradix_cache.py: the L1/L2 tree and its ack polling.

The protocol switches of docs/design.md §2 that concern L2 act here: `ack-count`, `tp-collective`,
`inflight-sends` in `check_hicache_events`, `host-alloc` in `write_backup` (`host-capacity` is
applied by the builder, `lru-clock` by the tree's clock). L3 (storage) lives in l3_protocol.
"""

from __future__ import annotations

import heapq
import logging
from collections import deque
from typing import TYPE_CHECKING, Any

import torch

from hicache_diag.engines.builtin.runtime.mem_cache.base_prefix_cache import MatchResult
from hicache_diag.engines.builtin.runtime.mem_cache.l2_protocol import L2ProtocolMixin
from hicache_diag.engines.builtin.runtime.mem_cache.l3_protocol import L3ProtocolMixin
from hicache_diag.engines.builtin.runtime.mem_cache.radix_cache import RadixCache, TreeNode, _cat
from hicache_diag.faults.side_pool import SidePool

if TYPE_CHECKING:
    from hicache_diag.engines.builtin.runtime.distributed.comm import HiCacheComm
    from hicache_diag.engines.builtin.runtime.managers.cache_controller import HiCacheController
    from hicache_diag.engines.builtin.runtime.managers.storage_controller import StorageController
    from hicache_diag.engines.builtin.runtime.mem_cache.allocator import TokenToKVPoolAllocator
    from hicache_diag.engines.builtin.runtime.mem_cache.evict_policy import TreeClock
    from hicache_diag.engines.builtin.runtime.mem_cache.memory_pool_host import HostKVCache
    from hicache_diag.engines.builtin.runtime.protocol import ProtocolConfig
    from hicache_diag.faults.hooks import Hooks

logger = logging.getLogger(__name__)


class HiRadixCache(L2ProtocolMixin, L3ProtocolMixin, RadixCache):
    """RadixCache whose nodes can also live on the host. Scheduler thread only.

    Nodes get a host copy by `write_backup` once their hit count reaches the policy's threshold;
    a written node stays locked until its write ack is consumed, a loaded node until its load
    ack is. Evicting a backed-up leaf demotes it to host; evicting any other leaf deletes it.
    """

    def __init__(
        self,
        allocator: TokenToKVPoolAllocator,
        page_size: int,
        clock: TreeClock,
        host_pool: HostKVCache,
        cache_controller: HiCacheController,
        protocol: ProtocolConfig,
        comm: HiCacheComm,
        write_policy: str,  # ServerArgs.hicache_write_policy: its default lives in run_options
        vote_slack: int,  # ServerArgs.pp_async_batch_depth
        storage_controller: StorageController | None = None,
    ) -> None:
        super().__init__(allocator, page_size, clock)
        self.mem_pool_host, self.cache_controller = host_pool, cache_controller
        self.protocol, self.comm, self.write_policy = protocol, comm, write_policy
        self.write_through_threshold = 1 if write_policy == "write_through" else 2
        self.load_back_threshold = page_size
        self.ongoing_write_through: dict[int, TreeNode] = {}
        self.ongoing_load_back: dict[int, TreeNode] = {}
        self.pending_backup: dict[int, TreeNode] = {}  # two-phase: requested, not yet decided
        self._queued_backup: list[TreeNode] = []
        self.write_back_refused: set[int] = set()  # two-phase write_back: delete on eviction
        self._votes: deque = deque()
        self.vote_delay = getattr(comm, "pp_size", 1) + vote_slack
        self.host_capacity = host_pool.size
        self.side_pool = SidePool()  # host-shortage: slots held away from this tree
        self._init_storage(storage_controller)
        self._reset_stats()

    def _reset_stats(self) -> None:
        self.acks_ready = {"write": 0, "load": 0}
        self.ack_pending_ms: dict[str, float] = {}
        self.acks_consumed = {"write": 0, "load": 0}
        self.sync_received: dict[str, Any] = {}
        self.host_alloc_failed = self.load_backs = self.write_backs = 0
        self.host_evicted = self.host_evict_calls = 0
        self.device_held = self.load_back_declined = 0
        self.host_shortages: list[dict[str, int]] = []
        self.tp_allreduce_skipped = 0

    # ---- tiers ------------------------------------------------------------------------------
    def _set_device(self, node: TreeNode, value: torch.Tensor) -> None:
        node.value = value
        if node.lock_ref > 0:
            self.protected_size_ += len(node.key)
        else:
            self.evictable_size_ += len(node.key)

    def match_prefix(self, key: list[int]) -> MatchResult:
        path = self._match_nodes(key)
        device = [n for n in path if not n.evicted]
        # device nodes form a prefix of any path: a child is evicted before its parent
        last_device = device[-1] if device else self.root_node
        host_hit = sum(len(n.key) for n in path[len(device) :])
        last_host = path[-1] if path else self.root_node
        return MatchResult(_cat([n.value for n in device]), last_device, last_host, host_hit)

    def _on_matched(self, node: TreeNode, value: torch.Tensor) -> int:
        if node.evicted:  # re-populate a host-only node with the caller's fresh slots
            self._set_device(node, value.clone())
            self._inc_hit_count(node)
            return 0
        self._inc_hit_count(node)
        return len(node.key)

    def _add_leaf(self, parent: TreeNode, key: list[int], value: torch.Tensor) -> TreeNode:
        node = super()._add_leaf(parent, key, value)
        self._inc_hit_count(node)
        return node

    def _inc_hit_count(self, node: TreeNode) -> None:
        if self.write_policy == "write_back":
            return  # write_back backs up on eviction only
        node.hit_count += 1
        if not node.backuped and node.hit_count >= self.write_through_threshold:
            self.write_backup(node)

    # ---- write path -------------------------------------------------------------------------
    def write_backup(self, node: TreeNode, write_back: bool = False) -> int:
        """Start a device->host copy of `node`; returns tokens written (0: not backed up)."""
        if node.backuped or node.evicted or node.id in self.pending_backup:
            return 0
        parent = node.parent
        if parent is not self.root_node and not (
            parent.backuped or parent.id in self.pending_backup
        ):
            return 0  # the host tree stays contiguous
        if self.protocol.host_alloc == "two-phase":
            return self.request_backup(node)  # agreed at the next ① (see l2_protocol)
        n = len(node.key)
        tag = {"ancestor_ids": self._ancestor_ids(node), "write_back": write_back}
        free = self.mem_pool_host.available_size()
        host_indices = self.cache_controller.write(node.value, node.id, tag=tag)
        evicted = calls = 0
        if host_indices is None:
            evicted, calls = self.evict_host(n), 1
            host_indices = self.cache_controller.write(node.value, node.id, tag=tag)
        if host_indices is None:
            self.host_alloc_failed += 1  # SGLang's shortage branch: this rank alone skips
            self.host_shortages.append(
                {"need": n, "free": free, "evicted": evicted, "evict_calls": calls}
            )
            return 0  # upstream returns 0 silently: the divergence point (#31425)
        node.host_value = host_indices.clone()
        self.ongoing_write_through[node.id] = node
        self.inc_lock_ref(node)
        self.write_backs += n
        return n

    def _ancestor_ids(self, node: TreeNode) -> list[int]:
        ids = []
        while node.parent is not None and node.parent is not self.root_node:
            node = node.parent
            ids.append(node.id)
        return ids

    # ---- eviction ---------------------------------------------------------------------------
    def _evict_node(self, node: TreeNode) -> int:
        if not node.backuped and self.write_policy == "write_back":
            if self.protocol.host_alloc == "two-phase":
                if self.defer_write_back(node):
                    return 0  # kept until the agreed backup lands; a later pass demotes it
            elif self.write_backup(node, True):
                self._finish_write_back(node)
        if not node.backuped:
            return super()._evict_node(node)
        self.allocator.free(node.value)  # demote: keep the host copy
        self.evictable_size_ -= len(node.key)
        node.value = None
        return len(node.key)

    def _finish_write_back(self, node: TreeNode) -> None:
        """write_back evicts synchronously: wait for this node's copy, then release it."""
        ack = self.cache_controller.ack_write_queue.pop()
        ack.finish_event.synchronize()
        self._finish_write_through_ack(node.id)
        self.cache_controller.events.append(
            {"event": "write", "phase": "consumed", "ack_id": ack.ack_id, "node_ids": ack.node_ids}
        )

    def _is_host_leaf(self, node: TreeNode) -> bool:
        return (
            node is not self.root_node
            and node.evicted
            and node.backuped
            and not node.children
            and node.host_ref_counter == 0
            and node.lock_ref == 0
        )

    def evict_host(self, num_tokens: int) -> int:
        heap = [self._heap_entry(n) for n in self._iter_nodes() if self._is_host_leaf(n)]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            node = heapq.heappop(heap)[2]
            freed += self.mem_pool_host.free(node.host_value)
            node.host_value = None
            self._delete_leaf(node)
            if self._is_host_leaf(node.parent):
                heapq.heappush(heap, self._heap_entry(node.parent))
        self.host_evicted += freed
        self.host_evict_calls += 1
        return freed

    def hold_host(self, hooks: Hooks | None) -> int:
        """The host-shortage side pool, settled once per step (faults/side_pool.py)."""
        return self.side_pool.hold(hooks, self.mem_pool_host)

    # ---- load path --------------------------------------------------------------------------
    def init_load_back(self, match: MatchResult, mem_quota: int) -> tuple[torch.Tensor, Any]:
        n = match.host_hit_length
        if n < self.load_back_threshold or n > mem_quota:
            return match.device_indices, match.last_device_node
        nodes, node = [], match.last_host_node
        while node is not match.last_device_node:
            nodes.append(node)
            node = node.parent
        nodes.reverse()
        device_indices = self.load_back(nodes, match.last_device_node, match.last_host_node)
        if device_indices is None:
            return match.device_indices, match.last_device_node
        return torch.cat([match.device_indices, device_indices]), match.last_host_node

    def load_back(self, nodes: list[TreeNode], ancestor: TreeNode, last: TreeNode):
        host_indices = torch.cat([n.host_value for n in nodes])
        self.inc_lock_ref(ancestor)  # keep the device prefix while making room
        side, held = SidePool(), 0  # device-alloc-fail: a concurrent consumer's, this load only
        hooks = getattr(self.mem_pool_host, "hooks", None)
        if hooks is not None and hooks.has("device_hold"):
            free = self.allocator.available_size()
            held = side.settle(
                self.allocator, hooks.apply("device_hold", 0, free=free, need=len(host_indices))
            )
            self.device_held += held
        try:
            device_indices = self._load_or_evict(host_indices, last)
        finally:
            side.settle(self.allocator, 0)
        self.dec_lock_ref(ancestor)
        if device_indices is None:
            self.load_back_declined += 1 if held else 0
            logger.warning(
                "load_back: FAILED to load %d tokens for node %d", len(host_indices), last.id
            )
            return None
        offset = 0
        for n in nodes:
            self._set_device(n, device_indices[offset : offset + len(n.key)])
            offset += len(n.key)
        self.ongoing_load_back[last.id] = last
        self.inc_lock_ref(last)
        self.load_backs += len(device_indices)
        return device_indices

    def _load_or_evict(self, host_indices: torch.Tensor, last: TreeNode):
        device_indices = self.cache_controller.load(host_indices, last.id)
        if device_indices is None:
            # write_back eviction may evict_host: the pages being loaded must stay
            last.host_ref_counter += 1
            self.evict(len(host_indices))
            last.host_ref_counter -= 1
            device_indices = self.cache_controller.load(host_indices, last.id)
        return device_indices

    # ---- ① the ack checks, upstream's methods (how many acks: l2_protocol) ---------------------

    def check_hicache_events(self) -> None:
        if self.protocol.inflight_sends == "bounded":
            self.comm.drain_async_work()  # #28916: backpressure instead of a growing leak
        if self.protocol.host_alloc == "two-phase":
            self.commit_pending_backups()
        if self.protocol.ack_count == "leader-batched":
            write, load = self._agree_counts(("write", "load"))  # one relay for both (#33473)
        else:
            (write,) = self._agree_counts(("write",))
            (load,) = self._agree_counts(("load",))
        self.writing_check(write)
        self.loading_check(load)
        self.check_storage_events()  # after the ack checks, at the same point on every rank

    def writing_check(self, finish_count: int) -> None:
        queue = self.cache_controller.ack_write_queue
        for _ in range(finish_count):
            ack = queue.pop(0)  # IndexError "pop from empty list" when this rank is behind: form B
            ack.finish_event.synchronize()  # blocks if this rank's DMA is slower than PP0's
            for node_id in ack.node_ids:
                self._finish_write_through_ack(node_id)
            self._consumed("write", ack)

    def _finish_write_through_ack(self, node_id: int) -> None:
        node = self.ongoing_write_through.pop(node_id)  # KeyError if this rank never wrote it
        self.dec_lock_ref(node)
        self.write_backup_storage(node)  # L2 -> L3 once the host copy is complete

    def loading_check(self, finish_count: int) -> None:
        queue = self.cache_controller.ack_load_queue
        for _ in range(finish_count):
            ack = queue.pop(0)
            ack.finish_event.synchronize()
            for node_id in ack.node_ids:
                self.dec_lock_ref(self.ongoing_load_back.pop(node_id))
            self._consumed("load", ack)

    def _consumed(self, kind: str, ack: Any) -> None:
        self.acks_consumed[kind] += 1
        self.cache_controller.events.append(
            {"event": kind, "phase": "consumed", "ack_id": ack.ack_id, "node_ids": ack.node_ids}
        )

    def ready_to_load_host_cache(self) -> int:
        producer_id = self.cache_controller.start_loading()
        self.cache_controller.layer_done_counter.set_consumer(producer_id)
        return producer_id

    # ---- evidence and invariants ------------------------------------------------------------
    def probe_stats(self) -> dict[str, Any]:
        stats = super().probe_stats()
        if self.protocol.host_capacity == "min":
            self.sync_received["host_capacity"] = self.host_capacity
        stats.update(
            queues=self.cache_controller.queue_depths(),
            acks_ready=self.acks_ready,
            ack_pending_ms=self.ack_pending_ms,
            acks_consumed=self.acks_consumed,
            sync_received=self.sync_received,
            host_alloc_failed=self.host_alloc_failed,
            # refused by the pool, retried or not: an evict_host + retry hides the refusal from
            # host_alloc_failed but not its effect (this rank alone evicted host nodes)
            host_pool_refused=self.mem_pool_host.take_alloc_failed(),
            # reserved slots of an undecided vote count as free: ranks agree on them
            host_free=self.mem_pool_host.available_size() + self.reserved_host_tokens(),
            host_capacity=self.host_capacity,
            host_evicted=self.host_evicted,
            host_evict_calls=self.host_evict_calls,
            device_held=self.device_held,
            load_back_declined=self.load_back_declined,
            host_shortage=len(self.host_shortages),
            host_shortages=self.host_shortages[:4],
            host_held=self.side_pool.tokens,
            dma_wait_ms=round(self.cache_controller.layer_done_counter.take_wait_s() * 1e3, 3),
            load_backs=self.load_backs,
            write_backs=self.write_backs,
            inflight_sends=self.comm.inflight_sends() if self.comm is not None else 0,
            tp_allreduce_skipped=self.tp_allreduce_skipped,
            events=self.cache_controller.events,
        )
        self.storage_probe_stats(stats)
        self.cache_controller.events = []
        self._reset_stats()
        return stats

    def check_integrity(self) -> None:
        super().check_integrity()
        self.mem_pool_host.check_integrity()
        host_tokens = 0
        for node in self._iter_nodes():
            if node is self.root_node:
                continue
            assert node.backuped or not node.evicted, f"node {node.id} on no tier"
            host_tokens += len(node.host_value) if node.backuped else 0
        used = self.mem_pool_host.size - self.mem_pool_host.available_size()
        used -= self.reserved_host_tokens() + self.storage_held_tokens() + self.side_pool.tokens
        assert host_tokens == used, f"tree holds {host_tokens} host tokens, pool has {used} used"
        for name, ongoing in (
            ("write", self.ongoing_write_through),
            ("load", self.ongoing_load_back),
        ):
            for node_id, node in ongoing.items():
                assert node.lock_ref > 0, f"ongoing {name} node {node_id} is not locked"
