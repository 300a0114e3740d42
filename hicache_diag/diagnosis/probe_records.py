"""The plugin's per-step probe records read back (`sources.<probe>` in rank<r>.jsonl, written
as evidence/probes.py says): what a decision did (`d`), and for the waiting
timeout which requests each rank dropped. One reading for attribution and for the export's tags."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

L3_DRAIN = "l3-control-queues"  # `d`: [storage hits, backups, host-memory releases] drained
WAITING = "waiting-clock"  # `d`: the rids the rank's own waiting timeout dropped
FLUSH = "flush-deadline"  # `d`: 'flush' (idle: tree reset) or 'timeout', as the flush ended


def outcomes(sources: Any, probe: str) -> list[Any]:
    """A step's `d` entries for `probe` (`sources` is the line's `sources` cell); [] when the
    decision did not act there."""
    record = sources.get(probe) if isinstance(sources, dict) else None
    found = record.get("d") if isinstance(record, dict) else None
    return list(found) if isinstance(found, list) else []


def first_drops(
    ranks: Iterable[int], rows: Iterable[tuple[int, int, Any]]
) -> dict[int, dict[str, int]]:
    """rank -> rid -> the first step at which that rank's waiting timeout dropped it, from
    (rank, step, sources) rows; every rank in `ranks` has an entry, empty when it dropped none."""
    out: dict[int, dict[str, int]] = {int(r): {} for r in ranks}
    for rank, step, sources in rows:
        mine = out.setdefault(int(rank), {})
        for rids in outcomes(sources, WAITING):
            for rid in rids if isinstance(rids, list) else ():
                mine[str(rid)] = min(int(step), mine.get(str(rid), int(step)))
    return out


def lone_drops(drops: dict[int, dict[str, int]]) -> list[tuple[int, int, str]]:
    """(step, rank, rid) of each drop some rank did not make, earliest first."""
    return sorted(
        (step, rank, rid)
        for rank, mine in drops.items()
        for rid, step in mine.items()
        if any(rid not in other for other in drops.values())
    )
