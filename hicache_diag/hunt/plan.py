"""A release's inventory -> what to run: the unaligned reads grouped by the trigger that pulls
them (the trigger covering most reads first), and the reads no trigger covers."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from hicache_diag.hunt.triggers import Trigger, triggers_for
from hicache_diag.sources.model import Source

UNALIGNED = "none"  # sources/model.py Alignment.mechanism of a read nothing aligns


@dataclass(frozen=True, slots=True)
class Candidate:
    trigger: Trigger
    sources: tuple[str, ...]  # "file:line function (kind -> decision)"


def describe(read: Source) -> str:
    return f"{read.file}:{read.line} {read.function} ({read.kind} -> {'/'.join(read.decisions)})"


def unaligned(reads: Iterable[Source]) -> list[Source]:
    """Reads the PP stages may see differently: nothing aligns them, or only a collective that
    stays inside one stage does (a MIN over its TP group, as 0.5.18's L3 queue drain: each stage
    then agrees with itself, not with the other stages)."""
    return [r for r in reads if _parts_stages(r.alignment)]


def _parts_stages(alignment: object) -> bool:
    if getattr(alignment, "mechanism", None) == UNALIGNED:
        return True
    return getattr(alignment, "covers_pp", None) is False


def plan_hunt(reads: Iterable[Source]) -> tuple[list[Candidate], list[str]]:
    """(candidates, the unaligned reads no trigger covers)."""
    covered: dict[str, tuple[Trigger, list[str]]] = {}
    unmapped = []
    for read in unaligned(reads):
        found = triggers_for(read)
        if not found:
            unmapped.append(describe(read))
        for trigger in found:
            covered.setdefault(trigger.name, (trigger, []))[1].append(describe(read))
    ranked = sorted(covered.values(), key=lambda tc: -len(tc[1]))
    return [Candidate(t, tuple(srcs)) for t, srcs in ranked], unmapped
