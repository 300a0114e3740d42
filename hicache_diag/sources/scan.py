"""Build the inventory of one source tree: every per-rank read that reaches a decision."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from hicache_diag.sources.decisions import Decisions
from hicache_diag.sources.flow import Trace, Tracer
from hicache_diag.sources.index import Function, SourceIndex, build_index, callee_name
from hicache_diag.sources.links import (
    branch_modes,
    imported_modules,
    in_place_use,
    link_backend_checks,
    sort_key_uses,
    sort_keys,
)
from hicache_diag.sources.locate import Tree
from hicache_diag.sources.model import LOGICAL, NONE, Alignment, Inventory, Release, Source, Use
from hicache_diag.sources.reads import Read, find_reads, lru_stamps, reads_clock
from hicache_diag.sources.rules import CLASSIC, LOGICAL_KINDS, LRU_STAMP_ATTRS, RANDOM_IN_PLACE
from hicache_diag.sources.sync import SyncSummaries


def scan_tree(tree: Tree) -> Inventory:
    """The files of `tree.scope` under `tree.root` (the `sglang` package dir, or
    hicache_diag/runtime)."""
    root, scope = tree.root, tree.scope
    base = root / scope.base if (root / scope.base).is_dir() else root
    index = build_index(root, scope.patterns, base)
    if scope.widen:
        extra = imported_modules(index, Decisions(index), base)
        prefix = base.relative_to(root).as_posix()
        patterns = (*scope.patterns, *(f"{prefix}/{rel}" for rel in extra))
        index = build_index(root, patterns, base)
    return scan_index(index, Release(tree.engine, tree.version, str(root)), _notes(root, index))


def scan_index(index: SourceIndex, release: Release, notes: tuple[str, ...] = ()) -> Inventory:
    decisions = Decisions(index)
    tracer = Tracer(index, SyncSummaries(index), decisions)
    keys = sort_keys(index)
    found: dict[str, list[Source]] = {"physical": [], "logical": []}
    backend: list[tuple[Function, Source]] = []
    dropped = 0
    for fn in index.functions:
        for read in find_reads(fn):
            trace = tracer.follow(fn, read.node)
            extra = sort_key_uses(trace.attrs, keys, decisions)
            if read.kind == "random" and callee_name(read.node) in RANDOM_IN_PLACE:
                extra.append(in_place_use(fn, read.node.lineno, decisions))
            trace.uses.extend(extra)
            src = _source(fn, read, trace, index)
            if read.backend:
                backend.append((fn, src))
            elif trace.uses:
                found[_group(read.kind)].append(src)
            else:
                dropped += 1
        for assign, call in lru_stamps(fn):
            found["physical"].append(_stamp_source(tracer, index, fn, assign, call))
    physical = found["physical"]
    physical += link_backend_checks(backend, physical, index)
    return Inventory(
        release, tuple(index.files), _ordered(physical), dropped, notes, _ordered(found["logical"])
    )


def _group(kind: str) -> str:
    return "logical" if kind in LOGICAL_KINDS else "physical"


def _ordered(sources: list[Source]) -> tuple[Source, ...]:
    return tuple(sorted((s for s in sources if s.uses), key=lambda s: (s.file, s.line, s.kind)))


def _source(fn: Function, read: Read, trace: Trace, index: SourceIndex) -> Source:
    classic = _classic(read.kind, read.text, fn, trace)
    uses = _dedupe(trace.uses)
    if classic == "lru-clock":
        # The eviction heap compares each rank's own stamps: whatever else the walk reaches
        # from the stamped node, the decision reads the clock value itself.
        uses = tuple(
            dataclasses.replace(u, alignment=NONE) for u in uses if u.decision == "eviction"
        )
    modes = branch_modes(trace.branches, index)
    return Source(
        fn.file, read.node.lineno, fn.qualname, read.kind, read.text, classic, uses, modes
    )


def _stamp_source(tracer: Tracer, index: SourceIndex, fn, assign: ast.Assign, call) -> Source:
    """An LRU stamp taken from a function: logical when that function reads no clock."""
    target = index.resolve(call, fn)
    if target is None:
        alignment = Alignment("unknown")
    elif reads_clock(target.node):
        alignment = dataclasses.replace(LOGICAL, mechanism="none", covers_pp=False, covers_tp=False)
    else:
        alignment = LOGICAL
    trace = Trace()
    attr = next(t.attr for t in assign.targets if isinstance(t, ast.Attribute))
    tracer.follow_stored(attr, (), 0, trace, {id(fn.node)})
    uses = tuple(dataclasses.replace(u, alignment=alignment) for u in _dedupe(trace.uses))
    return Source(
        fn.file, assign.lineno, fn.qualname, "lru-stamp", ast.unparse(call), "lru-clock", uses
    )


def _classic(kind: str, text: str, fn: Function, trace: Trace) -> str | None:
    if kind == "clock" and trace.attrs & LRU_STAMP_ATTRS:
        return "lru-clock"
    hay = f"{text} {fn.qualname}".lower()
    for name, k, hint in CLASSIC:
        if k == kind and hint in hay:
            return name
    return None


def _dedupe(uses: list[Use]) -> tuple[Use, ...]:
    seen: dict[tuple, Use] = {}
    for u in uses:
        seen.setdefault((u.file, u.line, u.decision, u.alignment.text, u.how), u)
    return tuple(sorted(seen.values(), key=lambda u: (u.file, u.line)))


def _notes(root: Path, index: SourceIndex) -> tuple[str, ...]:
    notes = []
    compiled = sorted(p.name for p in root.glob("srt/mem_cache/**/*.so"))
    if compiled:
        notes.append(
            "compiled code is not scanned (its reads are unknown): " + ", ".join(compiled[:3])
        )
    if index.unparsable:
        notes.append("could not parse: " + ", ".join(index.unparsable[:5]))
    if not index.files:
        notes.append("no file matched the scanned scope")
    return tuple(notes)
