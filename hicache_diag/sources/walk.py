"""One function's statements in order, with the names a per-rank value has reached: the uses
it records, the calls it follows the value into, and what the function returns."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from hicache_diag.sources.index import callee_name
from hicache_diag.sources.model import State, Use
from hicache_diag.sources.rules import CALLER_DEPTH, MAX_DEPTH, MAX_DOWN, MAX_WALKS
from hicache_diag.sources.shapes import (
    buffers,
    call_args,
    calls_in,
    header_exprs,
    is_bookkeeping,
    is_count_prefix,
    loop_acts,
    param_env,
)
from hicache_diag.sources.sync import alignment_of


@dataclass(slots=True)
class Trace:
    uses: list[Use] = field(default_factory=list)
    attrs: set[str] = field(default_factory=set)  # attributes the value was stored into
    # if/else whose branches align the value differently: (function, the `if`, then, else)
    branches: list[tuple] = field(default_factory=list)
    walks: int = 0  # function bodies walked, a callee once per call site


# `samples.append(latency)`: the local list carries the value (dynamic_chunk_sizer's profile).
_COLLECTS = frozenset({"append", "extend", "insert", "appendleft"})


def _weaker(a: State | None, b: State | None) -> State | None:
    if a is None:
        return b
    if b is None:
        return a
    return a if len(a) <= len(b) else b


class FunctionWalk:
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
        self.seed_positions: frozenset[int] | None = None  # see Tracer.follow_stored
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

    def bind(self, target: ast.AST, state: State, positions: frozenset[int] | None = None) -> None:
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
                    target.attr,
                    state,
                    self.depth,
                    self.out,
                    self.seen,
                    on_self,
                    self.hops,
                    positions,
                )

    def _unpack_seed(self, target: ast.AST, value: ast.AST, state: State) -> bool:
        """`req, deadline = self._pending` where only `deadline` was tainted when stored."""
        if self.seed_positions is None or not isinstance(target, ast.Tuple):
            return False
        if not self.is_seed(value):
            return False
        for i, elt in enumerate(target.elts):
            if i in self.seed_positions:
                self.bind(elt, state)
        return True

    # -- statements ---------------------------------------------------------------------------
    def block(self, stmts: list[ast.stmt], loop: ast.For | ast.While | None = None) -> None:
        for s in stmts:
            self.stmt(s, loop)

    def stmt(self, s: ast.stmt, loop) -> None:
        for expr in header_exprs(s):
            self.calls(expr)
            self.comprehension_tests(expr)
        if isinstance(s, ast.Assign):
            if (st := self.taint(s.value)) is not None:
                positions = None
                if isinstance(s.value, ast.Tuple):  # which elements of a stored tuple carry it
                    elts = enumerate(s.value.elts)
                    positions = frozenset(i for i, e in elts if self.taint(e) is not None)
                for t in s.targets:
                    if self._unpack_seed(t, s.value, st):
                        continue
                    self.bind(t, st, positions)
        elif isinstance(s, ast.AugAssign | ast.AnnAssign):
            if s.value is not None and (st := self.taint(s.value)) is not None:
                self.bind(s.target, st)
        elif isinstance(s, ast.If):
            self.branch(s, s.test, s.body + s.orelse, loop)
            self.if_else(s, loop)
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

    def if_else(self, s: ast.If, loop) -> None:
        """Each branch from the state before the `if`. Where both bind a value through
        different alignments (`if buffer_only and pp_size > 1: MIN over TP, else: MIN + PP
        relay`), the walk goes on with the else (the default mode) and records the pair."""
        before = dict(self.env)
        self.block(s.body, loop)
        if not s.orelse:
            return
        then_env, self.env = self.env, dict(before)
        self.block(s.orelse, loop)
        for name, then_state in then_env.items():
            else_state, was = self.env.get(name), before.get(name)
            if else_state is None:
                self.env[name] = then_state
            elif was is not None and then_state != else_state and not self.replay:
                if then_state[: len(was)] == was == else_state[: len(was)] and {
                    then_state,
                    else_state,
                }.isdisjoint({was}):  # both branches aligned the value, each its own way
                    self.out.branches.append((self.fn, s, then_state, else_state))

    def loop_body(self, loop: ast.For | ast.While) -> None:
        """Twice: a name tainted late in the body taints its reads early in the next turn. The
        second turn only binds names and records uses; it does not descend again."""
        self.block(loop.body, loop)
        self.replay += 1
        self.block(loop.body, loop)
        self.replay -= 1

    def branch(self, s: ast.stmt, test: ast.expr, body: list[ast.stmt], loop) -> None:
        st = self.taint(test)
        if st is None or is_bookkeeping(body):
            return
        if isinstance(loop, ast.For) and is_count_prefix(s, loop):
            # `for ack in q: if not ack.ready(): break; n += 1` computes a count; the count's
            # own uses are the decisions. Unless the loop body acts on each item as well.
            for counted in loop.body:  # the counter is control-dependent on the read
                if isinstance(counted, ast.AugAssign):
                    self.bind(counted.target, st)
            if not loop_acts(loop, s):
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
        for call in calls_in(expr):
            tainted = [(a, st) for a in call_args(call) if (st := self.taint(a)) is not None]
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
                for arg in call_args(call):
                    for buf in buffers(arg):
                        self.env[ast.unparse(buf)] = state + steps
                        self.attr_keys = self.attr_keys or isinstance(buf, ast.Attribute)
                self.results[id(call)] = state + steps  # what a wrapper returns is agreed too
                continue
            state = min((st for _, st in tainted), key=len)
            self.into_call(call, tainted, state)

    def into_call(self, call: ast.Call, tainted, state: State) -> None:
        name = callee_name(call) or ""
        if name in _COLLECTS and isinstance(call.func, ast.Attribute):
            if isinstance(holder := call.func.value, ast.Name):  # a local list now holds it
                self.env[holder.id] = _weaker(self.env.get(holder.id), state)
                return
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
            env = param_env(call, target, tainted)
            if env:
                walk = FunctionWalk(
                    self.t,
                    target,
                    lambda n: False,
                    env,
                    (),
                    self.depth + 1,
                    self.out,
                    self.seen,
                    up=False,
                    down=self.down + 1,
                )
                walk.hops = self.hops
                if walk.run_body():
                    self.results[id(call)] = walk.returned
                    if walk.returned is not None:
                        walk.on_return(walk.returned)  # a decision function's return is a use
                self.seen.discard(id(target.node))  # another call site may pass other values
        decision = self.t.decisions.of_name(name)
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
            walk = FunctionWalk(
                self.t,
                caller,
                lambda n, c=call: n is c,
                {},
                state,
                self.depth + 1,
                self.out,
                self.seen,
                up=True,
            )
            walk.hops = self.hops
            walk.run()

    def use(self, line: int, state: State, how: str, decided=None) -> None:
        decision, where = decided or self.t.decisions.of_function(self.fn)
        # Decided on one rank only (a leader's function), the raw read needs no agreement.
        leader = None if state else self.t.leaders.alignment(self.fn)
        self.out.uses.append(
            Use(
                self.fn.file,
                line,
                self.fn.qualname,
                decision,
                where,
                leader or alignment_of(state),
                how,
                self.depth,
            )
        )
