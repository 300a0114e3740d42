"""Which calls make ranks agree on a value: collectives and PP relays, found in the callee's own
body (SGLang's `_all_reduce`, `_pp_sync`, `_all_reduce_attn_groups` are summarised, not named)."""

from __future__ import annotations

import ast
from dataclasses import dataclass

from hicache_diag.sources.index import Function, SourceIndex, callee_name, receiver_text
from hicache_diag.sources.model import NONE, Alignment, SyncStep
from hicache_diag.sources.rules import PP_GROUP_HINT, PRIMITIVES, REDUCE_OPS


@dataclass(frozen=True, slots=True)
class _Step:
    kind: str
    op: str | None
    op_param: str | None  # the op is this parameter of the summarised function
    groups: tuple[str, ...]
    via: str
    group_param: str | None = None  # the groups are this parameter of the summarised function


def _group_name(text: str) -> str:
    last = text.rsplit(".", 1)[-1]
    return last[: -len("_group")] if last.endswith("_group") else last


class SyncSummaries:
    def __init__(self, index: SourceIndex) -> None:
        self._index = index
        self._memo: dict[int, tuple[_Step, ...]] = {}

    def steps_of_call(self, call: ast.Call, caller: Function) -> tuple[SyncStep, ...]:
        """The alignment steps a call applies to the values passed to it; () when none."""
        raw = self._call_steps(call, caller, set())
        merged: dict[tuple, set[str]] = {}
        for s in raw:
            op = s.op if s.op_param is None else None  # an unresolved op param: unknown op
            groups = s.groups if s.group_param is None else ("?",)
            merged.setdefault((s.kind, op, s.via), set()).update(groups)
        steps = [SyncStep(k, op, _ordered(g), via) for (k, op, via), g in merged.items()]
        return tuple(sorted(steps, key=lambda s: _KIND_ORDER.get(s.kind, 9)))

    def _call_steps(self, call: ast.Call, caller: Function, busy: set[int]) -> tuple[_Step, ...]:
        name = callee_name(call)
        if name in PRIMITIVES:
            step = self._primitive(call, caller, name)
            return (step,) if step else ()
        target = self._index.resolve(call, caller)
        if target is None:
            return ()
        steps = []
        for s in self._summary(target, busy):
            if s.op_param is not None:  # bind the callee's op parameter to this call's argument
                arg = _arg_for(call, target, s.op_param)
                op, param = _op_of(arg, caller) if arg is not None else (None, None)
                s = _Step(s.kind, op, param, s.groups, s.via, s.group_param)
            if s.group_param is not None:
                arg = _arg_for(call, target, s.group_param)
                groups, gparam = (
                    self._groups_of_expr(arg, caller) if arg is not None else (("?",), None)
                )
                s = _Step(s.kind, s.op, s.op_param, groups, s.via, gparam)
            steps.append(s)
        return tuple(steps)

    def _summary(self, fn: Function, busy: set[int]) -> tuple[_Step, ...]:
        key = id(fn.node)
        if key in self._memo:
            return self._memo[key]
        if key in busy:
            return ()
        busy.add(key)
        steps: list[_Step] = []
        for sub in ast.walk(fn.node):
            if isinstance(sub, ast.Call):
                steps.extend(self._call_steps(sub, fn, busy))
        busy.discard(key)
        self._memo[key] = tuple(dict.fromkeys(steps))
        return self._memo[key]

    def _primitive(self, call: ast.Call, fn: Function, name: str) -> _Step | None:
        kind, fixed_groups, default_op = PRIMITIVES[name]
        groups, gparam = (fixed_groups, None) if fixed_groups else self._groups(call, fn)
        if gparam is None and kind == "pp_relay" and not any(PP_GROUP_HINT in g for g in groups):
            return None  # a p2p call on some other group: not the PP relay
        op = param = None
        if kind == "all_reduce":
            arg = _kw(call, "op")
            if arg is None and len(call.args) > 1:
                arg = call.args[1]
            op, param = _op_of(arg, fn) if arg is not None else (default_op, None)
        return _Step(kind, op, param, groups, fn.name, gparam)

    def _groups(self, call: ast.Call, fn: Function) -> tuple[tuple[str, ...], str | None]:
        """(group names, None), or ((), parameter) when the caller passes the groups."""
        arg = _kw(call, "group")
        if arg is None:
            arg = _positional_group(call)
        if arg is None:
            recv = receiver_text(call)
            if recv in ("torch.distributed", "dist", ""):
                return ("world",), None
            return (_group_name(recv),), None
        if isinstance(arg, ast.Name):  # `for group in (self.attn_cp_group, ...)` / in a param
            for sub in ast.walk(fn.node):
                if (
                    isinstance(sub, ast.For)
                    and isinstance(sub.target, ast.Name)
                    and sub.target.id == arg.id
                ):
                    if isinstance(sub.iter, ast.Tuple | ast.List):
                        names = [_group_name(ast.unparse(e)) for e in sub.iter.elts]
                        return (*names, *self._fallback_groups(fn, arg.id)), None
                    return self._groups_of_expr(sub.iter, fn)
        return self._groups_of_expr(arg, fn)

    def _groups_of_expr(self, expr: ast.expr, fn: Function) -> tuple[tuple[str, ...], str | None]:
        if isinstance(expr, ast.Name) and expr.id in fn.params:
            return (), expr.id
        known = _group_name(expr.attr) in _GROUP_ORDER if isinstance(expr, ast.Attribute) else True
        if not known and isinstance(expr.value, ast.Name):  # a list or alias: what it holds
            built = self._built_groups(expr.attr, fn)
            if built:
                return built, None
        return (_group_name(ast.unparse(expr)),), None

    def _built_groups(self, attr: str, fn: Function) -> tuple[str, ...]:
        """A list of groups kept in `self.x`: the `*_group`s its builder references, the builder
        being `self.x = self._create_sync_groups()` or a method doing `self.x.append(...)`."""
        family = {fn.cls, *self._index.ancestors(fn.cls)}
        for other in self._index.functions:
            if other.cls not in family or (other.cls == fn.cls and other.file != fn.file):
                continue
            for sub in ast.walk(other.node):
                builder = self._builder(sub, attr, other)
                if builder is None:
                    continue
                called = {id(c.func) for c in ast.walk(builder.node) if isinstance(c, ast.Call)}
                names = [
                    _group_name(name)
                    for n in ast.walk(builder.node)
                    if id(n) not in called  # `create_custom_parallel_group(...)` builds, not is
                    and (name := _ref_name(n))
                    and name.endswith("_group")
                    and name != attr
                    and name not in _GROUP_HANDLES
                ]
                if names:
                    return tuple(dict.fromkeys(names))
        return ()

    def _builder(self, sub: ast.AST, attr: str, fn: Function) -> Function | None:
        if isinstance(sub, ast.Assign) and isinstance(sub.value, ast.Call | ast.Attribute):
            if any(isinstance(t, ast.Attribute) and t.attr == attr for t in sub.targets):
                if isinstance(sub.value, ast.Attribute):  # `self.g = tp_group.cpu_group`
                    return _Snippet(fn, sub.value)
                return self._index.resolve(sub.value, fn)
        if (
            isinstance(sub, ast.Call)
            and callee_name(sub) == "append"
            and isinstance(sub.func, ast.Attribute)
            and isinstance(sub.func.value, ast.Attribute)
            and sub.func.value.attr == attr
        ):
            return fn
        return None

    def _fallback_groups(self, fn: Function, loop_var: str) -> tuple[str, ...]:
        # `if not reduced: all_reduce(..., group=self.tp_group)` after the loop: list it too.
        extra = []
        for sub in ast.walk(fn.node):
            if isinstance(sub, ast.Call) and callee_name(sub) == "all_reduce":
                g = _kw(sub, "group")
                if g is not None and not (isinstance(g, ast.Name) and g.id == loop_var):
                    extra.append(_group_name(ast.unparse(g)))
        return tuple(extra)


# `tp_group.cpu_group` / `.device_group` are handles of the group named before them.
_GROUP_HANDLES = frozenset({"cpu_group", "device_group"})


@dataclass(frozen=True, slots=True)
class _Snippet:
    """An expression standing in for a builder function (`node` is what gets walked)."""

    fn: Function
    node: ast.AST


def _ref_name(n: ast.AST) -> str | None:
    if isinstance(n, ast.Attribute):
        return n.attr
    if isinstance(n, ast.Name):
        return n.id
    return None


_KIND_ORDER = {"all_reduce": 0, "gather": 1, "broadcast": 2, "pp_relay": 3}
_GROUP_ORDER = ("attn_cp", "attn_tp", "tp", "pp", "world")


def _ordered(groups: set[str]) -> tuple[str, ...]:
    known = [g for g in _GROUP_ORDER if g in groups]
    return (*known, *sorted(groups - set(known)))


def _positional_group(call: ast.Call) -> ast.expr | None:
    """`broadcast_pyobj(data, rank, world_group.cpu_group, src=0)`: the group passed by
    position, named by the group it is a handle of (`world_group`)."""
    for arg in call.args:
        if isinstance(arg, ast.Attribute) and arg.attr in _GROUP_HANDLES:
            arg = arg.value
        if isinstance(arg, ast.Attribute | ast.Name) and _ref_name(arg).endswith("_group"):
            return arg
    return None


def _kw(call: ast.Call, name: str) -> ast.expr | None:
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    return None


def _arg_for(call: ast.Call, target: Function, param: str) -> ast.expr | None:
    if (v := _kw(call, param)) is not None:
        return v
    params = target.params
    if param in params and params.index(param) < len(call.args):
        return call.args[params.index(param)]
    return None


def _op_of(expr: ast.expr, fn: Function) -> tuple[str | None, str | None]:
    """(literal op, None) or (None, parameter name) for an op argument."""
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return expr.value.upper(), None
    last = ast.unparse(expr).rsplit(".", 1)[-1]
    if last.upper() in REDUCE_OPS and last.isupper():
        return last, None
    if isinstance(expr, ast.Name) and expr.id in fn.params:
        return None, expr.id
    return None, None


def alignment_of(steps: tuple[SyncStep, ...]) -> Alignment:
    """Name the mechanism that a chain of steps amounts to (docs/sources.md, alignment rules)."""
    if not steps:
        return NONE
    ops = sorted({s.op.lower() for s in steps if s.kind == "all_reduce" and s.op})
    has_reduce = any(s.kind == "all_reduce" for s in steps)
    # A broadcast over PP or over the world group hands every stage the source rank's value
    # (dynamic_chunk_sizer's `broadcast_pyobj(..., world_group, src=0)`): a leader's relay.
    relay = any(
        s.kind in ("pp_relay", "broadcast") and (_pp(s.groups) or "world" in s.groups)
        for s in steps
    )
    gather = any(s.kind == "gather" for s in steps)
    base = "+".join(ops) or ("all-reduce" if has_reduce else "")
    if gather:
        base = "+".join(filter(None, (base, "gather")))
    if any(s.kind == "broadcast" and not (_pp(s.groups) or "world" in s.groups) for s in steps):
        base = "+".join(filter(None, (base, "broadcast")))
    mechanism = "+".join(filter(None, (base, "leader-relay" if relay else "")))
    covers_pp = relay or any(_pp(s.groups) or "world" in s.groups for s in steps)
    tp_like = ("tp", "attn_tp", "attn_cp", "world")
    covers_tp = any(g in tp_like for s in steps for g in s.groups) or None
    return Alignment(mechanism or "unknown", steps, covers_pp, covers_tp)


def _pp(groups: tuple[str, ...]) -> bool:
    return any(PP_GROUP_HINT in g for g in groups)
