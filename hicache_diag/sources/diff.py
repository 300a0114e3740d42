"""Compare the inventories of two releases: sources added, removed and re-aligned, and how each
classic source's alignment changed."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from hicache_diag.sources.model import DIFF_SCHEMA, Inventory, Release, Source

CLASSIC_ORDER = ("dma-ack-count", "l3-hit", "l3-progress", "host-alloc", "lru-clock")


@dataclass(frozen=True, slots=True)
class Realigned:
    a: Source
    b: Source

    def to_json(self) -> dict:
        return {
            "key": self.b.key,
            "a": {"line": self.a.line, "alignment": self.a.alignment.to_json()},
            "b": {"line": self.b.line, "alignment": self.b.alignment.to_json()},
        }


@dataclass(frozen=True, slots=True)
class ClassicChange:
    """One classic source across the two releases: its alignments (mechanism -> how many reads
    have it) and the functions they are read in."""

    classic: str
    a: dict[str, int]
    b: dict[str, int]
    a_functions: tuple[str, ...]
    b_functions: tuple[str, ...]

    @property
    def changed(self) -> bool:
        return self.a != self.b

    def to_json(self) -> dict:
        return {
            "classic": self.classic,
            "a": self.a,
            "b": self.b,
            "a_functions": list(self.a_functions),
            "b_functions": list(self.b_functions),
            "changed": self.changed,
        }


@dataclass(frozen=True, slots=True)
class InventoryDiff:
    a: Release
    b: Release
    added: tuple[Source, ...]
    removed: tuple[Source, ...]
    realigned: tuple[Realigned, ...]
    classic: tuple[ClassicChange, ...]
    relays_a: tuple[str, ...]  # functions that relay values down PP (e.g. _pp_sync)
    relays_b: tuple[str, ...]

    def to_json(self) -> dict:
        return {
            "schema": DIFF_SCHEMA,
            "a": self.a.to_json(),
            "b": self.b.to_json(),
            "added": [s.to_json() for s in self.added],
            "removed": [s.to_json() for s in self.removed],
            "realigned": [r.to_json() for r in self.realigned],
            "classic": [c.to_json() for c in self.classic],
            "pp_relays": {"a": list(self.relays_a), "b": list(self.relays_b)},
        }


def _keyed(inv: Inventory) -> dict[str, Source]:
    """Key -> source; a key repeated within one function (two clock reads) gets #2, #3..."""
    out: dict[str, Source] = {}
    count: dict[str, int] = defaultdict(int)
    for s in inv.sources:
        count[s.key] += 1
        out[s.key if count[s.key] == 1 else f"{s.key}#{count[s.key]}"] = s
    return out


def label(s: Source) -> str:
    """`min+leader-relay`, or `min (no PP)` when the alignment leaves the PP stages out."""
    a = s.alignment
    if a.mechanism in ("none", "logical", "unknown") or a.covers_pp:
        return a.mechanism
    return f"{a.mechanism} ({'no' if a.covers_pp is False else '?'} PP)"


def _shape(s: Source) -> tuple:
    a = s.alignment
    groups = frozenset(g for step in a.steps for g in step.groups)
    return a.mechanism, a.covers_pp, a.covers_tp, groups


def _classic(inv: Inventory, name: str) -> tuple[dict[str, int], tuple[str, ...]]:
    mechs: dict[str, int] = defaultdict(int)
    fns: list[str] = []
    for s in inv.sources:
        if s.classic == name:
            mechs[label(s)] += 1
            fns.append(s.function)
    return dict(sorted(mechs.items())), tuple(dict.fromkeys(fns))


def pp_relays(inv: Inventory) -> tuple[str, ...]:
    return tuple(
        sorted(
            {
                step.via
                for s in inv.sources
                for u in s.uses
                for step in u.alignment.steps
                if step.kind == "pp_relay"
            }
        )
    )


def diff_inventories(a: Inventory, b: Inventory) -> InventoryDiff:
    ka, kb = _keyed(a), _keyed(b)
    added = tuple(kb[k] for k in kb if k not in ka)
    removed = tuple(ka[k] for k in ka if k not in kb)
    realigned = tuple(
        Realigned(ka[k], kb[k]) for k in kb if k in ka and _shape(ka[k]) != _shape(kb[k])
    )
    classic = []
    for name in CLASSIC_ORDER:
        (ma, fa), (mb, fb) = _classic(a, name), _classic(b, name)
        classic.append(ClassicChange(name, ma, mb, fa, fb))
    return InventoryDiff(
        a.release, b.release, added, removed, realigned, tuple(classic), pp_relays(a), pp_relays(b)
    )
