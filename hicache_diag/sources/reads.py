"""Detection rules: the reads of per-rank physical quantities in one function's body."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass

from hicache_diag.sources.index import Function, callee_name, receiver_text
from hicache_diag.sources.rules import (
    ALLOC_METHODS,
    CLOCK_FUNCS,
    EXISTS_CHECKS,
    EXISTS_FUNCS,
    LRU_STAMP_ATTRS,
    POOL_SIZE_METHODS,
    RANDOM_RECEIVERS,
    READY_METHODS,
    STORAGE_EXISTS_METHODS,
    STORAGE_FUNCS,
    STORAGE_READ_METHODS,
    STORAGE_RECEIVER_SUFFIXES,
)

# Bare names that are unambiguous clock reads (`from time import monotonic`); a bare `time()`
# could be anything.
_BARE_CLOCKS = frozenset({"monotonic", "perf_counter", "monotonic_ns", "perf_counter_ns"})


@dataclass(frozen=True, slots=True, eq=False)
class Read:
    node: ast.expr  # the expression whose value is per-rank
    kind: str
    text: str
    backend: bool = False  # inside a storage backend's own existence check


def _storage_receiver(call: ast.Call) -> bool:
    """`self.storage_backend.get(...)`: the receiver's own name says backend (an env var such
    as `envs.X_BACKEND.get()` is upper case and is not one)."""
    last = receiver_text(call).rsplit(".", 1)[-1]
    return last.islower() and last.endswith(STORAGE_RECEIVER_SUFFIXES)


def kind_of_call(call: ast.Call) -> str | None:
    """The READ_KINDS kind of a call, or None when it reads nothing per-rank."""
    name = callee_name(call)
    f = call.func
    if name is None:
        return None
    if isinstance(f, ast.Attribute):
        recv = receiver_text(call)
        if name in CLOCK_FUNCS and recv == "time":
            return "clock"
        if recv in RANDOM_RECEIVERS:
            return "random"
        if name in READY_METHODS and not call.args and not call.keywords:
            return "event-ready"
        if name == "qsize":
            return "queue-size"
        if name in POOL_SIZE_METHODS:
            return "pool-size"
        if name in ALLOC_METHODS:
            return "alloc-result"
        if name in STORAGE_EXISTS_METHODS and (name != "exists" or _storage_receiver(call)):
            return "storage-exists"
        if name in STORAGE_READ_METHODS and (name != "get" or _storage_receiver(call)):
            return "storage-read"
        if name in STORAGE_FUNCS:
            return "storage-read"
        if name == "get_nowait" or (name == "get" and _nonblocking(call)):
            return "thread-value"
        return None
    if name in _BARE_CLOCKS:
        return "clock"
    if name in STORAGE_FUNCS:
        return "storage-read"
    if name == "len" and call.args and "queue" in ast.unparse(call.args[0]).lower():
        # A queue.Queue has no len(): this is a list the scheduler thread fills itself.
        return "logical-state"
    return None


def _exists_check(call: ast.Call, fn: Function) -> bool:
    """In a backend's existence check, what it consults (`os.path.exists(p)`,
    `self.metadata_cache.contains(k)`); its own `self.exists(k)` is the check, not a read."""
    if not any(h in fn.name for h in EXISTS_FUNCS) or callee_name(call) not in EXISTS_CHECKS:
        return False
    return isinstance(call.func, ast.Attribute) and receiver_text(call) not in ("self", "cls")


def _nonblocking(call: ast.Call) -> bool:
    return any(
        kw.arg == "block" and isinstance(kw.value, ast.Constant) and kw.value.value is False
        for kw in call.keywords
    )


# A function that is itself one of these reads (an allocator's `alloc`, a pool's
# `available_size`) implements the quantity: the reads inside it are its parts, and its callers'
# reads are the sources.
_IMPLEMENTS = {"pool-size": POOL_SIZE_METHODS, "alloc-result": ALLOC_METHODS | POOL_SIZE_METHODS}


def find_reads(fn: Function) -> Iterator[Read]:
    implemented = {k for k, names in _IMPLEMENTS.items() if fn.name in names}
    for sub in _walk_own(fn.node):
        if not isinstance(sub, ast.Call):
            continue
        if kind := kind_of_call(sub):
            if kind in implemented or (kind == "pool-size" and fn.name in ALLOC_METHODS):
                continue
            yield Read(sub, kind, ast.unparse(sub))
        elif _exists_check(sub, fn):
            yield Read(sub, "storage-exists", ast.unparse(sub), backend=True)


def lru_stamps(fn: Function) -> Iterator[tuple[ast.Assign, ast.Call]]:
    """`x.last_access_time = f()` where f is not itself a clock read (those are found as clock
    reads): the stamp's source is f; the caller decides whether it is logical."""
    for sub in _walk_own(fn.node):
        if not isinstance(sub, ast.Assign) or not isinstance(sub.value, ast.Call):
            continue
        stamps = [
            t for t in sub.targets if isinstance(t, ast.Attribute) and t.attr in LRU_STAMP_ATTRS
        ]
        if stamps and kind_of_call(sub.value) is None:
            yield sub, sub.value


def reads_clock(node: ast.AST) -> bool:
    return any(isinstance(s, ast.Call) and kind_of_call(s) == "clock" for s in ast.walk(node))


def _walk_own(node: ast.AST) -> Iterator[ast.AST]:
    """ast.walk without descending into nested defs and lambdas (their own scope)."""
    stack = list(ast.iter_child_nodes(node))
    while stack:
        sub = stack.pop()
        yield sub
        if not isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            stack.extend(ast.iter_child_nodes(sub))
