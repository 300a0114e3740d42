"""Follows one per-rank value through a function (and the call graph) to the decisions it feeds.

Taint is by name: a local, a `self.` attribute, a tuple element. A value is "aligned" by the
sync steps it went through (an argument passed to an all_reduce / PP relay is aligned after the
call). The walk goes down into callees that receive the value, up to callers when a function
returns it, across attributes (a stored value is followed to the functions that read that
attribute) and across queues (an item `put` on `x.some_queue` is followed to `some_queue.get`).
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass, field

from hicache_diag.sources.decisions import Decisions
from hicache_diag.sources.index import Function, SourceIndex, callee_name
from hicache_diag.sources.model import SyncStep, Use
from hicache_diag.sources.rules import (
    BOOKKEEPING_ATTR_HINTS,
    BOOKKEEPING_CALL_HINTS,
    CALLER_DEPTH,
)
from hicache_diag.sources.sync import SyncSummaries, alignment_of

State = tuple[SyncStep, ...]  # the sync steps a tainted value has been through; () = raw
MAX_DEPTH = 6
MAX_READERS = 8  # an attribute read in more functions than this is too common to follow
MAX_WALKS = 40  # function bodies one source's walk may visit (keeps the scan to seconds)
MAX_DOWN = 2  # callee levels a value is followed into (callers are walked before deep callees)
MAX_HOPS = 2  # attribute/queue crossings per walk (thread -> queue -> thread -> scheduler)


@dataclass(slots=True)
class Trace:
    uses: list[Use] = field(default_factory=list)
    attrs: set[str] = field(default_factory=set)  # attributes the value was stored into
    walks: int = 0  # function bodies walked, a callee once per call site


class Tracer:
    def __init__(self, index: SourceIndex, sync: SyncSummaries, decisions: Decisions) -> None:
        self.index = index
        self.sync = sync
        self.decisions = decisions

    def follow(self, fn: Function, node: ast.AST) -> Trace:
        """Every use of the value of `node` (an expression in `fn`)."""
        out = Trace()
        _FnWalk(self, fn, lambda n: n is node, {}, (), 0, out, set(), up=True).run()
        return out

    def follow_stored(
        self,
        attr: str,
        state: State,
        depth: int,
        out: Trace,
        seen: set,
        on_self: str | None = None,
        hops: int = 0,
    ) -> None:
        """A value stored in `x.attr` reaches the functions that read `.attr`; stored on self
        (`on_self` = the class), only that class's own `self.attr` reads, so that common names
        do not join unrelated classes."""
        out.attrs.add(attr)
        if on_self is not None:
            pool = [
                fn
                for fn in self.index.self_attr_readers.get(attr, [])
                if _same_object(fn.cls, on_self)
            ]
        else:
            pool = self.index.attr_readers.get(attr, [])
        if len(pool) > MAX_READERS:  # a common name: follow only into decision functions
            pool = [fn for fn in pool if self.decisions.of_function(fn, callers=False)[1]]
        if len(pool) > MAX_READERS or hops >= MAX_HOPS:
            return
        for fn in [fn for fn in pool if id(fn.node) not in seen]:
            match = _attr_load_matcher(attr)
            walk = _FnWalk(self, fn, match, {}, state, depth + 1, out, seen, up=True)
            walk.hops = hops + 1
            walk.run()

    def follow_queue(
        self, queue: str, state: State, depth: int, out: Trace, seen: set, hops: int = 0
    ) -> None:
        def match(n: ast.AST) -> bool:
            return (
                isinstance(n, ast.Call)
                and callee_name(n) in ("get", "get_nowait")
                and isinstance(n.func, ast.Attribute)
                and ast.unparse(n.func.value).rsplit(".", 1)[-1] == queue
            )

        pool = self.index.queue_readers.get(queue, [])
        if len(pool) > MAX_READERS or hops >= MAX_HOPS:
            return
        for fn in [fn for fn in pool if id(fn.node) not in seen]:
            walk = _FnWalk(self, fn, match, {}, state, depth + 1, out, seen, up=True)
            walk.hops = hops + 1
            walk.run()


def _same_object(cls: str | None, owner: str) -> bool:
    """The Scheduler is assembled from mixins (SchedulerPPMixin, ...): one `self` for all."""
    if cls == owner:
        return True
    return bool(cls and owner and cls.startswith("Scheduler") and owner.startswith("Scheduler"))


def _attr_load_matcher(attr: str) -> Callable[[ast.AST], bool]:
    def match(n: ast.AST) -> bool:
        return isinstance(n, ast.Attribute) and n.attr == attr and isinstance(n.ctx, ast.Load)

    return match


def _weaker(a: State | None, b: State | None) -> State | None:
    if a is None:
        return b
    if b is None:
        return a
    return a if len(a) <= len(b) else b


class _FnWalk:
    """One function's statements in order, with the names the value has reached."""

    def __init__(self, tracer, fn, is_seed, env, seed_state, depth, out, seen, up, down=0):
        self.t = tracer
        self.fn = fn
        self.is_seed = is_seed
        self.env: dict[str, State] = dict(env)
        self.seed_state: State = seed_state
        self.depth = depth
        self.out: Trace = out
        self.seen: set[int] = seen
        self.up = up  # may walk up to callers when the value is returned
        self.down = down  # callee levels below the walk this one descended from
        self.returned: State | None = None
        self.attr_keys = any("." in k for k in self.env)
        self.carriers: dict[str, State] = {}  # objects given a tainted field in this function
        self.replay = 0  # > 0 in a loop body's second turn
        self.hops = 0  # attribute/queue crossings on the path to this walk
        # calls walked into: what their return carries (None: nothing), in place of the
        # default "a call with a tainted argument returns a tainted value"
        self.results: dict[int, State | None] = {}

    def run(self) -> State | None:
        if self.run_body() and self.returned is not None:
            self.on_return(self.returned)
        return self.returned

    def run_body(self) -> bool:
        """Walk the body once; False when the budget or an earlier visit stops it."""
        if id(self.fn.node) in self.seen or self.out.walks >= MAX_WALKS:
            return False
        self.out.walks += 1
        self.seen.add(id(self.fn.node))
        self.block(self.fn.node.body)
        return True

    # -- expressions --------------------------------------------------------------------------
    def taint(self, expr: ast.AST | None) -> State | None:
        if expr is None:
            return None
        if self.is_seed(expr):
            return self.seed_state
        if isinstance(expr, ast.Call) and id(expr) in self.results:
            return self.results[id(expr)]
        if isinstance(expr, ast.Name):
            return self.env.get(expr.id)
        if isinstance(expr, ast.Attribute) and self.attr_keys:
            if (key := ast.unparse(expr)) in self.env:
                return self.env[key]
        if isinstance(expr, ast.Lambda | ast.FunctionDef):
            return None
        found = None
        for child in ast.iter_child_nodes(expr):
            if isinstance(child, ast.expr_context):
                continue
            found = _weaker(found, self.taint(child))
        return found

    def bind(self, target: ast.AST, state: State) -> None:
        if isinstance(target, ast.Name):
            self.env[target.id] = state
        elif isinstance(target, ast.Tuple | ast.List):
            for elt in target.elts:
                self.bind(elt, state)
        elif isinstance(target, ast.Starred):
            self.bind(target.value, state)
        elif isinstance(target, ast.Subscript):
            self.bind(target.value, state)
        elif isinstance(target, ast.Attribute):
            self.env[ast.unparse(target)] = state
            self.attr_keys = True
            if isinstance(target.value, ast.Name) and target.value.id != "self":
                self.carriers[target.value.id] = state  # followed only when put on a queue
            if self.depth < MAX_DEPTH and not self.replay:
                on_self = None
                if isinstance(target.value, ast.Name) and target.value.id == "self":
                    on_self = self.fn.cls or ""
                self.t.follow_stored(
                    target.attr, state, self.depth, self.out, self.seen, on_self, self.hops
                )

    # -- statements ---------------------------------------------------------------------------
    def block(self, stmts: list[ast.stmt], loop: ast.For | ast.While | None = None) -> None:
        for s in stmts:
            self.stmt(s, loop)

    def stmt(self, s: ast.stmt, loop) -> None:
        for expr in _header_exprs(s):
            self.calls(expr)
            self.comprehension_tests(expr)
        if isinstance(s, ast.Assign):
            if (st := self.taint(s.value)) is not None:
                for t in s.targets:
                    self.bind(t, st)
        elif isinstance(s, ast.AugAssign | ast.AnnAssign):
            if s.value is not None and (st := self.taint(s.value)) is not None:
                self.bind(s.target, st)
        elif isinstance(s, ast.If):
            self.branch(s, s.test, s.body + s.orelse, loop)
            self.block(s.body, loop)
            self.block(s.orelse, loop)
        elif isinstance(s, ast.While):
            self.branch(s, s.test, s.body, None)
            self.loop_body(s)
        elif isinstance(s, ast.For | ast.AsyncFor):
            if (st := self.taint(s.iter)) is not None:
                self.bind(s.target, st)
            self.loop_body(s)
            self.block(s.orelse, loop)
        elif isinstance(s, ast.With | ast.AsyncWith):
            self.block(s.body, loop)
        elif isinstance(s, ast.Try):
            for body in (s.body, *(h.body for h in s.handlers), s.orelse, s.finalbody):
                self.block(body, loop)
        elif isinstance(s, ast.Return):
            self.returned = _weaker(self.returned, self.taint(s.value))
        elif isinstance(s, ast.Delete):
            for t in s.targets:
                if (st := self.taint(t)) is not None:
                    self.use(s.lineno, st, "count-loop")

    def loop_body(self, loop: ast.For | ast.While) -> None:
        """Twice: a name tainted late in the body taints its reads early in the next turn. The
        second turn only binds names and records uses; it does not descend again."""
        self.block(loop.body, loop)
        self.replay += 1
        self.block(loop.body, loop)
        self.replay -= 1

    def branch(self, s: ast.stmt, test: ast.expr, body: list[ast.stmt], loop) -> None:
        st = self.taint(test)
        if st is None or _bookkeeping(body):
            return
        if isinstance(loop, ast.For) and _is_count_prefix(s, loop):
            # `for ack in q: if not ack.ready(): break; n += 1` computes a count; the count's
            # own uses are the decisions. Unless the loop body acts on each item as well.
            for counted in loop.body:  # the counter is control-dependent on the read
                if isinstance(counted, ast.AugAssign):
                    self.bind(counted.target, st)
            if not _loop_acts(loop, s):
                return
            self.use(loop.lineno, st, "count-loop")
            return
        self.use(test.lineno, st, "branch")

    def comprehension_tests(self, expr: ast.AST) -> None:
        for sub in ast.walk(expr):
            if isinstance(sub, ast.comprehension):
                for cond in sub.ifs:
                    if (st := self.taint(cond)) is not None:
                        self.use(cond.lineno, st, "branch")
            elif isinstance(sub, ast.IfExp) and (st := self.taint(sub.test)) is not None:
                self.use(sub.test.lineno, st, "branch")

    def calls(self, expr: ast.AST) -> None:
        for call in _calls_in(expr):
            tainted = [(a, st) for a in _call_args(call) if (st := self.taint(a)) is not None]
            if not tainted and callee_name(call) == "put":
                tainted = [
                    (a, self.carriers[a.id])
                    for a in call.args
                    if isinstance(a, ast.Name) and a.id in self.carriers
                ]
            if not tainted:
                continue
            steps = self.t.sync.steps_of_call(call, self.fn)
            if steps:  # every buffer passed holds the agreed value after the call (gathers fill
                state = min((st for _, st in tainted), key=len)  # an output buffer in place)
                for arg in _call_args(call):
                    for buf in _buffers(arg):
                        self.env[ast.unparse(buf)] = state + steps
                        self.attr_keys = self.attr_keys or isinstance(buf, ast.Attribute)
                self.results[id(call)] = state + steps  # what a wrapper returns is agreed too
                continue
            state = min((st for _, st in tainted), key=len)
            self.into_call(call, tainted, state)

    def into_call(self, call: ast.Call, tainted, state: State) -> None:
        name = callee_name(call) or ""
        if self.replay:
            return
        if name == "put" and isinstance(call.func, ast.Attribute):
            queue = ast.unparse(call.func.value).rsplit(".", 1)[-1]
            if "queue" in queue.lower() and self.depth < MAX_DEPTH:
                self.t.follow_queue(queue, state, self.depth, self.out, self.seen, self.hops)
            return
        target = self.t.index.resolve(call, self.fn)
        before = len(self.out.uses)
        if (
            target is not None
            and self.depth < MAX_DEPTH
            and self.down < MAX_DOWN
            and id(target.node) not in self.seen
        ):
            env = _param_env(call, target, tainted)
            if env:
                walk = _FnWalk(self.t, target, lambda n: False, env, (), self.depth + 1,
                               self.out, self.seen, up=False, down=self.down + 1)  # fmt: skip
                walk.hops = self.hops
                if walk.run_body():
                    self.results[id(call)] = walk.returned
                    if walk.returned is not None:
                        walk.on_return(walk.returned)  # a decision function's return is a use
                self.seen.discard(id(target.node))  # another call site may pass other values
        decision = self.t.decisions.of_name(name, call)
        if decision and len(self.out.uses) == before:
            self.use(call.lineno, state, "call-arg", decided=(decision, name))

    def on_return(self, state: State) -> None:
        decision = self.t.decisions.of_function(self.fn, callers=False)
        if decision[0] != "unknown":
            self.use(self.fn.node.lineno, state, "returned", decided=decision)
        if not self.up or self.depth >= CALLER_DEPTH:
            return
        for caller, call in self.t.index.callers(self.fn):
            if id(caller.node) in self.seen:
                continue
            walk = _FnWalk(self.t, caller, lambda n, c=call: n is c, {}, state, self.depth + 1,
                           self.out, self.seen, up=True)  # fmt: skip
            walk.hops = self.hops
            walk.run()

    def use(self, line: int, state: State, how: str, decided=None) -> None:
        decision, where = decided or self.t.decisions.of_function(self.fn)
        self.out.uses.append(
            Use(
                self.fn.file,
                line,
                self.fn.qualname,
                decision,
                where,
                alignment_of(state),
                how,
                self.depth,
            )
        )


def _param_env(call: ast.Call, target: Function, tainted) -> dict[str, State]:
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


def _buffers(arg: ast.expr) -> list[ast.expr]:
    """The names a collective writes through: `t`, `self.buf`, `self.buf.flatten()`."""
    if isinstance(arg, ast.Name | ast.Attribute):
        return [arg]
    if isinstance(arg, ast.Call) and isinstance(arg.func, ast.Attribute):
        return _buffers(arg.func.value)
    return []


def _call_args(call: ast.Call) -> list[ast.expr]:
    return [*call.args, *(kw.value for kw in call.keywords)]


def _calls_in(expr: ast.AST) -> list[ast.Call]:
    out = [s for s in ast.walk(expr) if isinstance(s, ast.Call)]
    return sorted(out, key=lambda c: (c.lineno, c.col_offset))


def _header_exprs(s: ast.stmt) -> list[ast.AST]:
    if isinstance(s, ast.If | ast.While):
        return [s.test]
    if isinstance(s, ast.For | ast.AsyncFor):
        return [s.iter]
    if isinstance(s, ast.With | ast.AsyncWith):
        return [i.context_expr for i in s.items]
    if isinstance(s, ast.Try | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return []
    return [s]


def _is_count_prefix(s: ast.stmt, loop: ast.For) -> bool:
    return (
        isinstance(s, ast.If)
        and s in loop.body
        and len(s.body) == 1
        and isinstance(s.body[0], ast.Break)
        and not s.orelse
    )


def _loop_acts(loop: ast.For, guard: ast.stmt) -> bool:
    """Whether the loop does more per item than count it."""
    for s in loop.body:
        if s is guard or isinstance(s, ast.AugAssign | ast.Pass):
            continue
        return True
    return False


def _bookkeeping(body: list[ast.stmt]) -> bool:
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
