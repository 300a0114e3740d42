"""Divergence sources in a rank's own pools: host shortages, evictions, failed or refused
allocs, and device slots held during load-backs, each read from what that rank recorded."""

from __future__ import annotations

import pandas as pd

from hicache_diag.diagnosis.divergence_values import only_some, per_rank_sum
from hicache_diag.evidence.verdict import DivergenceSource

Attribution = tuple[DivergenceSource, int | None, str]


def _first_shortage(window: pd.DataFrame, rank: int) -> str:
    """What the rank read at its first skipped backup (`host_shortages`), as evidence text."""
    if "host_shortages" not in window.columns:
        return ""
    mine = window[window["rank"] == rank].sort_values("step", kind="stable")
    for step, found in zip(mine["step"], mine["host_shortages"], strict=True):
        if isinstance(found, list) and found:
            first = found[0]
            return (
                f"; first at step {int(step)}: needed {first.get('need')} tokens with "
                f"{first.get('free')} free; evict_host ran {first.get('evict_calls', '?')} time(s) "
                f"and freed {first.get('evicted')}"
            )
    return ""


def host_shortage_source(window: pd.DataFrame, step: int) -> Attribution | None:
    """SGLang's own shortage branch skipped backups on some ranks only (`host_shortage`)."""
    counts = only_some(per_rank_sum(window, "host_shortage"))
    if not counts:
        return None
    culprit = max(sorted(counts), key=lambda r: counts[r])
    return (
        DivergenceSource.HOST_ALLOC,
        culprit,
        f"the host pool was short for write-through backups only on rank(s) {sorted(counts)} "
        f"before step {step} (backups skipped: {counts}){_first_shortage(window, culprit)}",
    )


def host_eviction_source(window: pd.DataFrame, step: int) -> Attribution | None:
    """A backup that found the pool short made room with SGLang's own `evict_host` on some
    ranks only: their host trees dropped nodes their peers kept (`host_evicted`)."""
    counts = only_some(per_rank_sum(window, "host_evicted"))
    if not counts:
        return None
    return (
        DivergenceSource.HOST_ALLOC,
        max(sorted(counts), key=lambda r: counts[r]),
        f"evict_host freed host tokens only on rank(s) {sorted(counts)} before step {step} "
        f"({counts}): a backup found that rank's host pool short and evicted host nodes its "
        "peers kept",
    )


def host_alloc_source(window: pd.DataFrame, step: int) -> Attribution | None:
    counts = only_some(per_rank_sum(window, "host_alloc_failed"))
    if not counts:
        return None
    return (
        DivergenceSource.HOST_ALLOC,
        max(sorted(counts), key=lambda r: counts[r]),
        f"host alloc failed only on rank(s) {sorted(counts)} before step {step}: {counts}",
    )


def _voted(frames: pd.DataFrame) -> bool:
    """Whether host allocs were decided by a vote anywhere in the run (two-phase)."""
    if "sync_received" not in frames.columns:
        return False
    return any(
        isinstance(v, dict) and ("host_alloc" in v or "prefetch_alloc" in v)
        for v in frames["sync_received"]
    )


def pool_refusal_source(
    window: pd.DataFrame, frames: pd.DataFrame, step: int
) -> Attribution | None:
    """No vote decides allocs: a pool refusal that write_backup's evict_host + retry hid from
    host_alloc_failed still made this rank alone evict host nodes."""
    if _voted(frames):
        return None  # the vote absorbs a refusal; a refusal follows some other difference
    counts = only_some(per_rank_sum(window, "host_pool_refused"))
    if not counts:
        return None
    return (
        DivergenceSource.HOST_ALLOC,
        max(sorted(counts), key=lambda r: counts[r]),
        f"the host pool refused allocs only on rank(s) {sorted(counts)} before step {step}: "
        f"{counts}",
    )


def device_hold_source(window: pd.DataFrame, step: int) -> Attribution | None:
    """Device slots were held during load-backs on some ranks only (`device_held`, recorded by
    the load-back hook): that rank's `_load_back_transfers` found its device pool short and its
    own `evict_for_alloc` evicted (or it declined) what its peers kept. Not a classic source,
    so the source stays `unknown`; the rank is named from its own record, not from a 1-1 tie
    over the diverging field (docs/evidence.md)."""
    counts = only_some(per_rank_sum(window, "device_held"))
    if not counts:
        return None
    declined = {r: n for r, n in per_rank_sum(window, "load_back_declined").items() if n}
    return (
        DivergenceSource.UNKNOWN,
        max(sorted(counts), key=lambda r: counts[r]),
        f"device slots were held during load-backs only on rank(s) {sorted(counts)} before "
        f"step {step} (tokens held: {counts}; load-backs declined: {declined or 'none'}): "
        "that rank's load-back found its device pool short and evicted or declined alone",
    )
