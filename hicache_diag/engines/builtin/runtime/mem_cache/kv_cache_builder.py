"""Mirrors sglang/srt/mem_cache/kv_cache_builder.py: build one rank's cache tiers."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from hicache_diag.engines.builtin.runtime.managers.cache_controller import HiCacheController
from hicache_diag.engines.builtin.runtime.managers.storage_builder import build_storage_controller
from hicache_diag.engines.builtin.runtime.mem_cache.allocator import TokenToKVPoolAllocator
from hicache_diag.engines.builtin.runtime.mem_cache.base_prefix_cache import BasePrefixCache
from hicache_diag.engines.builtin.runtime.mem_cache.evict_policy import TreeClock
from hicache_diag.engines.builtin.runtime.mem_cache.hiradix_cache import HiRadixCache
from hicache_diag.engines.builtin.runtime.mem_cache.memory_pool import MHATokenToKVPool
from hicache_diag.engines.builtin.runtime.mem_cache.memory_pool_host import HostKVCache
from hicache_diag.engines.builtin.runtime.mem_cache.radix_cache import RadixCache
from hicache_diag.engines.builtin.runtime.protocol import ProtocolConfig
from hicache_diag.engines.builtin.runtime.server_args import ServerArgs
from hicache_diag.faults.hooks import Hooks

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class KVCacheBundle:
    """What the scheduler and model runner of one rank use. `host_pool` and `controller` are
    None when `enable_hierarchical_cache` is off."""

    allocator: TokenToKVPoolAllocator
    kv_pool: MHATokenToKVPool
    tree_cache: BasePrefixCache
    host_pool: Any = None
    controller: Any = None
    storage: Any = None  # the L3 StorageController, when a storage backend is on

    def shutdown(self) -> None:
        """Stop the storage threads and the DMA thread (idempotent); call on every exit path."""
        if self.storage is not None:
            self.storage.stop()
        if self.controller is not None:
            self.controller.shutdown()


def build_kv_cache(
    server_args: ServerArgs,
    protocol: ProtocolConfig,
    comm: Any,
    hooks: Hooks | None,
    pp_rank: int,
    tp_rank: int,
    default_storage_dir: str | None = None,
) -> KVCacheBundle:
    """Device pool + allocator + tree; with HiCache also the host pool and controller, and with
    a storage backend the started L3 threads (pages under `--hicache-storage-dir`, else
    `default_storage_dir`). With `host-capacity=min` this is a collective over every rank."""
    hooks = hooks or Hooks(pp_rank=pp_rank, tp_rank=tp_rank)
    page = server_args.page_size
    model = server_args.model
    allocator = TokenToKVPoolAllocator(server_args.max_total_tokens, page)
    kv_pool = MHATokenToKVPool(
        allocator.size,
        server_args.layers_of_stage(pp_rank),
        max(1, model.num_heads // server_args.tp_size),
        model.head_dim,
        torch.float32,
        server_args.device,
    )
    clock = TreeClock(protocol.lru_clock, hooks)
    if not server_args.enable_hierarchical_cache:
        return KVCacheBundle(allocator, kv_pool, RadixCache(allocator, page, clock))
    tree, host_pool, controller = build_hiradix_cache(
        server_args, protocol, comm, hooks, pp_rank, allocator, kv_pool, clock
    )
    storage = build_storage_controller(
        server_args, protocol, comm, host_pool, hooks=hooks, default_dir=default_storage_dir
    )
    if storage is not None:
        tree._init_storage(storage)
        storage.start()
    return KVCacheBundle(allocator, kv_pool, tree, host_pool, controller, storage)


def build_hiradix_cache(server_args, protocol, comm, hooks, pp_rank, allocator, kv_pool, clock):
    """Host pool (capacity MIN-synced across ranks with host-capacity=min, #29258), controller
    and tree. Returns (tree, host_pool, controller)."""
    capacity = server_args.host_token_capacity(pp_rank)
    if protocol.host_capacity == "min" and comm is not None:
        t = torch.tensor([capacity], dtype=torch.int64)
        comm.all_reduce_pp(t, "min")
        if int(t.item()) != capacity:
            logger.info(
                "Sync fixed-size HiCache host token capacity from %d to %d.",
                capacity,
                int(t.item()),
            )
        capacity = int(t.item())
    host_pool = HostKVCache(
        capacity,
        server_args.page_size,
        kv_pool.layer_num,
        kv_pool.head_num,
        kv_pool.head_dim,
        kv_pool.dtype,
        hooks,
    )
    controller = HiCacheController(allocator, kv_pool, host_pool, hooks)
    tree = HiRadixCache(
        allocator,
        server_args.page_size,
        clock,
        host_pool,
        controller,
        protocol,
        comm,
        server_args.hicache_write_policy,
        vote_slack=server_args.pp_async_batch_depth,
    )
    return tree, host_pool, controller
