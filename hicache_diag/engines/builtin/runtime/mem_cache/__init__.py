"""Mirrors sglang/srt/mem_cache: the cache tiers of one rank.

L1: `allocator.TokenToKVPoolAllocator` (device slots, page granular) and `memory_pool.
MHATokenToKVPool` (per-layer device K/V); `radix_cache.RadixCache` (page-granular prefix tree,
LRU eviction via `evict_policy`). L2: `memory_pool_host.HostKVCache` (fixed token capacity) and
`hiradix_cache.HiRadixCache` (write-through/back, demotion, load-back), whose ack and host-alloc
consensus (the L2 protocol switches) lives in `l2_protocol`. `kv_cache_builder.build_kv_cache`
assembles a rank's bundle; the copy thread and queues are in `runtime/managers/`.
"""
