"""FAULTS: every injector by its CLI name (kebab-case), in the order of docs/faults.md."""

from __future__ import annotations

from types import MappingProxyType

from hicache_diag.faults.base import Fault
from hicache_diag.faults.clock_skew import ClockSkew
from hicache_diag.faults.device_alloc_fail import DeviceAllocFail
from hicache_diag.faults.dma_delay import DmaDelay
from hicache_diag.faults.flush_clock import FlushClock
from hicache_diag.faults.host_alloc_fail import HostAllocFail
from hicache_diag.faults.host_shortage import HostShortage
from hicache_diag.faults.l3_partial_hit import L3PartialHit
from hicache_diag.faults.p2p_delay import P2pDelay
from hicache_diag.faults.prefetch_alloc_fail import PrefetchAllocFail
from hicache_diag.faults.rank_stall import RankStall
from hicache_diag.faults.session_clock import SessionClock
from hicache_diag.faults.sglang_injectors import SglangH2dDelay, SglangStorageInjector

FAULTS: MappingProxyType[str, type[Fault]] = MappingProxyType(
    {
        cls.NAME: cls
        for cls in (
            DmaDelay,
            HostAllocFail,
            ClockSkew,
            L3PartialHit,
            P2pDelay,
            RankStall,
            HostShortage,
            PrefetchAllocFail,
            DeviceAllocFail,
            SglangStorageInjector,
            SglangH2dDelay,
            SessionClock,
            FlushClock,
        )
    }
)
