"""Shapes of statements and calls the value walk needs to recognise (pure ast predicates)."""

from __future__ import annotations

import ast

from hicache_diag.sources.index import Function
from hicache_diag.sources.model import State
from hicache_diag.sources.rules import BOOKKEEPING_ATTR_HINTS, BOOKKEEPING_CALL_HINTS


def param_env(call: ast.Call, target: Function, tainted) -> dict[str, State]:
    env: dict[str, State] = {}
    params = target.params
    ids = {id(a): st for a, st in tainted}
    for i, arg in enumerate(call.args):
        if id(arg) in ids and i < len(params):
            env[params[i]] = ids[id(arg)]
    for kw in call.keywords:
        if id(kw.value) in ids and kw.arg in params:
            env[kw.arg] = ids[id(kw.value)]
    return env


def buffers(arg: ast.expr) -> list[ast.expr]:
    """The names a collective writes through: `t`, `self.buf`, `self.buf.flatten()`."""
    if isinstance(arg, ast.Name | ast.Attribute):
        return [arg]
    if isinstance(arg, ast.Call) and isinstance(arg.func, ast.Attribute):
        return buffers(arg.func.value)
    return []


def call_args(call: ast.Call) -> list[ast.expr]:
    return [*call.args, *(kw.value for kw in call.keywords)]


def calls_in(expr: ast.AST) -> list[ast.Call]:
    out = [s for s in ast.walk(expr) if isinstance(s, ast.Call)]
    return sorted(out, key=lambda c: (c.lineno, c.col_offset))


def header_exprs(s: ast.stmt) -> list[ast.AST]:
    if isinstance(s, ast.If | ast.While):
        return [s.test]
    if isinstance(s, ast.For | ast.AsyncFor):
        return [s.iter]
    if isinstance(s, ast.With | ast.AsyncWith):
        return [i.context_expr for i in s.items]
    if isinstance(s, ast.Try | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return []
    return [s]


def is_count_prefix(s: ast.stmt, loop: ast.For) -> bool:
    return (
        isinstance(s, ast.If)
        and s in loop.body
        and len(s.body) == 1
        and isinstance(s.body[0], ast.Break)
        and not s.orelse
    )


def loop_acts(loop: ast.For, guard: ast.stmt) -> bool:
    """Whether the loop does more per item than count it."""
    for s in loop.body:
        if s is guard or isinstance(s, ast.AugAssign | ast.Pass):
            continue
        return True
    return False


def is_bookkeeping(body: list[ast.stmt]) -> bool:
    """A branch whose statements only log, count metrics or stamp times decides nothing."""
    if not body:
        return False
    for s in body:
        if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call):
            text = ast.unparse(s.value.func).lower()
            if not any(h in text for h in BOOKKEEPING_CALL_HINTS):
                return False
        elif isinstance(s, ast.Assign | ast.AugAssign):
            targets = s.targets if isinstance(s, ast.Assign) else [s.target]
            text = " ".join(ast.unparse(t).lower() for t in targets)
            if not any(h in text for h in BOOKKEEPING_ATTR_HINTS):
                return False
        else:
            return False
    return True
