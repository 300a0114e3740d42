"""Flows the by-name walk does not see on its own: a stored value read by a sort key, a backend's
existence check reached through the controller's `storage_backend.batch_exists(...)`, the
alignment per code branch, and the modules a decision's file imports from (the widened scope)."""

from __future__ import annotations

import ast
import dataclasses
from collections import defaultdict
from pathlib import Path

from hicache_diag.sources.decisions import Decisions
from hicache_diag.sources.index import Function, SourceIndex, callee_name
from hicache_diag.sources.model import NONE, BranchMode, Source, Use
from hicache_diag.sources.rules import SORT_CALLS, STORAGE_EXISTS_METHODS
from hicache_diag.sources.sync import alignment_of

SortKeys = dict[str, list[tuple[Function, int]]]


def sort_keys(index: SourceIndex) -> SortKeys:
    """Attribute name -> the sorts whose key reads it (`q.sort(key=lambda r: (r.priority,
    r.time_stats.wait_queue_entry_time))`), as (function, line)."""
    out: SortKeys = defaultdict(list)
    for fn in index.functions:
        defs = (d for d in ast.walk(fn.node) if isinstance(d, ast.FunctionDef))
        local_defs = {d.name: d for d in defs if d is not fn.node}
        for call in ast.walk(fn.node):
            if not isinstance(call, ast.Call) or callee_name(call) not in SORT_CALLS:
                continue
            for kw in call.keywords:
                if kw.arg != "key":
                    continue
                body = kw.value
                if isinstance(body, ast.Name) and body.id in local_defs:
                    body = local_defs[body.id]
                for attr in {a.attr for a in ast.walk(body) if isinstance(a, ast.Attribute)}:
                    out[attr].append((fn, call.lineno))
    return out


def sort_key_uses(attrs: set[str], keys: SortKeys, decisions: Decisions) -> list[Use]:
    """A per-rank value stored in `x.attr` orders every sort whose key reads `.attr`: each rank
    sorts by its own value (a clock stamp: its own clock)."""
    uses = []
    for attr in sorted(attrs):
        for fn, line in keys.get(attr, ()):
            decision, where = decisions.of_function(fn)
            uses.append(Use(fn.file, line, fn.qualname, decision, where, NONE, "sort-key", 1))
    return uses


def in_place_use(fn: Function, line: int, decisions: Decisions) -> Use:
    """`random.shuffle(waiting_queue)`: the draw is the decision's own act (the order)."""
    decision, where = decisions.of_function(fn)
    return Use(fn.file, line, fn.qualname, decision, where, NONE, "in-place", 0)


def link_backend_checks(
    backend: list[tuple[Function, Source]], sources: list[Source], index: SourceIndex
) -> list[Source]:
    """A backend's existence check (`HiCacheFile.exists`: its metadata cache, the file system)
    answers the controller's `storage_backend.batch_exists(...)`: it feeds the decisions that
    call does, aligned as that call's result is (the MIN-voted hit). Matched by the backend
    methods the check serves (`exists` also serves the base class's `batch_exists`)."""
    linked = []
    for fn, s in backend:
        served = _served(fn, index)
        voted = [v for v in sources if v.kind == "storage-exists" and _calls(v, served)]
        uses = tuple(dataclasses.replace(u, depth=u.depth + 1) for v in voted for u in v.uses)
        if uses:
            linked.append(dataclasses.replace(s, uses=uses))
    return linked


def _served(fn: Function, index: SourceIndex) -> set[str]:
    """The backend methods (`exists`, `batch_exists*`) whose `self.` calls reach fn within its
    class and the classes it derives from."""
    family = {fn.cls, *index.ancestors(fn.cls)}
    served: set[str] = set()
    todo, seen = [fn.name], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in STORAGE_EXISTS_METHODS:
            served.add(name)
        for caller, call in index.calls_to.get(name, ()):
            f = call.func
            if (
                isinstance(f, ast.Attribute)
                and ast.unparse(f.value) == "self"
                and (caller.cls in family)
            ):
                todo.append(caller.name)
    return served


def _calls(s: Source, methods: set[str]) -> bool:
    return any(f".{name}(" in s.expr for name in methods)


def branch_modes(branches: list[tuple], index: SourceIndex) -> tuple[BranchMode, ...]:
    """The trace's if/else pairs as modes: the `if` test, the flags it reads, both alignments."""
    out: dict[tuple, BranchMode] = {}
    for fn, node, then_state, else_state in branches:
        then, orelse = alignment_of(then_state), alignment_of(else_state)
        if then.text == orelse.text:
            continue
        mode = BranchMode(
            fn.file, node.lineno, ast.unparse(node.test), _flags(node.test, fn, index), then, orelse
        )
        out.setdefault((mode.file, mode.line), mode)
    return tuple(out.values())


def _flags(test: ast.expr, fn: Function, index: SourceIndex) -> tuple[str, ...]:
    """`self.host_memory_mode == "buffer_only"`, where the class set `self.host_memory_mode =
    get_memory().hicache_host_memory_mode`: `--hicache-host-memory-mode buffer_only`."""
    flags = []
    for cmp in ast.walk(test):
        if not isinstance(cmp, ast.Compare) or not isinstance(cmp.left, ast.Attribute):
            continue
        field = _server_field(cmp.left.attr, fn, index)
        if field is None or len(cmp.comparators) != 1:
            continue
        right = cmp.comparators[0]
        value = right.value if isinstance(right, ast.Constant) else ast.unparse(right)
        op = "" if isinstance(cmp.ops[0], ast.Eq) else f"{_OPS.get(type(cmp.ops[0]), '?')} "
        flags.append(f"--{field.replace('_', '-')} {op}{value}")
    return tuple(flags)


_OPS = {ast.NotEq: "!=", ast.Gt: ">", ast.GtE: ">=", ast.Lt: "<", ast.LtE: "<="}


def _server_field(attr: str, fn: Function, index: SourceIndex) -> str | None:
    """The server-args field a `self.attr` of fn's class was set from (its name ends attr)."""
    for other in index.functions:
        if other.cls != fn.cls or other.file != fn.file:
            continue
        for sub in ast.walk(other.node):
            if not isinstance(sub, ast.Assign) or not isinstance(sub.value, ast.Attribute):
                continue
            if any(isinstance(t, ast.Attribute) and t.attr == attr for t in sub.targets):
                if sub.value.attr.endswith(attr):
                    return sub.value.attr
    return None


def imported_modules(index: SourceIndex, decisions: Decisions, base: Path) -> tuple[str, ...]:
    """Files (relative to `base`) that a file defining a decision function imports from."""
    files = {fn.file for fn in index.functions if decisions.of_function(fn, callers=False)[1]}
    out: set[str] = set()
    for file in files:
        for name, module in index.imports.get(file, {}).items():
            for rel in (module, module[: -len(".py")] + f"/{name}.py"):
                if (base / rel).is_file() and rel not in index.files:
                    out.add(rel)
    return tuple(sorted(out))
