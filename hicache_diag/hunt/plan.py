"""A release's inventory -> what to run: the unaligned reads grouped by the trigger that pulls
them (the trigger covering most reads first), and the reads no trigger covers."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from hicache_diag.hunt.triggers import Read, Trigger, triggers_for

UNALIGNED = "none"  # sources/model.py Alignment.mechanism of a read nothing aligns


class Located(Read, Protocol):
    file: str
    line: int
    function: str

    @property
    def alignment(self) -> object: ...


@dataclass(frozen=True, slots=True)
class Candidate:
    trigger: Trigger
    sources: tuple[str, ...]  # "file:line function (kind -> decision)"


def describe(read: Located) -> str:
    return f"{read.file}:{read.line} {read.function} ({read.kind} -> {'/'.join(read.decisions)})"


def unaligned(reads: Iterable[Located]) -> list[Located]:
    return [r for r in reads if getattr(r.alignment, "mechanism", None) == UNALIGNED]


def plan_hunt(reads: Iterable[Located]) -> tuple[list[Candidate], list[str]]:
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
