"""prefetch-alloc-fail: one rank's host pool is short when an L3 prefetch allocates its
bounce slots, so SGLang's cache-mode `allocate_storage_hit` evicts host nodes and then
prefetches only part of the hit (or none) on that rank.

The same physical event as host-shortage (a side pool holds that stage's host slots; see
faults/side_pool.py), aimed at the L3 prefetch: it needs --hicache-storage-backend file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from hicache_diag.faults.host_shortage import HostShortage


@dataclass(frozen=True, slots=True)
class PrefetchAllocFail(HostShortage):
    NAME: ClassVar[str] = "prefetch-alloc-fail"
    SUMMARY: ClassVar[str] = "one stage's host pool is short for L3 prefetches (partial prefetch)"
    ACTS_IN: ClassVar[tuple[tuple[str, str], ...]] = (
        (
            "0.5.22+",
            "UnifiedRadixCache._try_alloc_storage_hit -> "
            "HybridCacheController.allocate_storage_hit(allow_partial=True, evict_host)",
        ),
        (
            "0.5.12-0.5.21",
            "the prefetch's host alloc (prefetch_from_storage: "
            "mem_pool_host.alloc -> evict_host -> retry)",
        ),
        ("builtin", "the L3 prefetch's host alloc (l3_host_alloc.py)"),
    )
    CANNOT: ClassVar[str] = (
        "a shortage that only the prefetch sees: the held slots are short for write-through "
        "backups on that stage too (as with a real sidecar)"
    )
