"""Parsed source tree: every function and method in scope, and who calls whom (by name)."""

from __future__ import annotations

import ast
import builtins
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from hicache_diag.sources.rules import GENERIC_NAMES


@dataclass(frozen=True, slots=True, eq=False)
class Function:
    file: str  # relative display path
    cls: str | None
    name: str
    node: ast.FunctionDef | ast.AsyncFunctionDef

    @property
    def qualname(self) -> str:
        return f"{self.cls}.{self.name}" if self.cls else self.name

    @property
    def params(self) -> list[str]:
        args = self.node.args
        names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
        return names[1:] if self.cls and names[:1] in (["self"], ["cls"]) else names


def callee_name(call: ast.Call) -> str | None:
    f = call.func
    if isinstance(f, ast.Attribute):
        return f.attr
    if isinstance(f, ast.Name):
        return f.id
    return None


def receiver_text(call: ast.Call) -> str:
    """`self.cache_controller.mem_pool_host` for `self.cache_controller.mem_pool_host.alloc(n)`."""
    f = call.func
    return ast.unparse(f.value) if isinstance(f, ast.Attribute) else ""


def same_object(cls: str | None, owner: str | None) -> bool:
    """The Scheduler is assembled from mixins (SchedulerPPMixin, ...): one `self` for all. Its
    components (SchedulerFlushWrapper, SchedulerMetricsReporter) are objects of their own."""
    if cls == owner:
        return True
    return bool(cls and owner and _scheduler_part(cls) and _scheduler_part(owner))


def _scheduler_part(cls: str) -> bool:
    return cls == "Scheduler" or (cls.startswith("Scheduler") and cls.endswith("Mixin"))


def _module_file(module: str) -> str:
    """`sglang.srt.mem_cache.radix_cache` -> `mem_cache/radix_cache.py` (display paths are
    relative to srt/, or to the builtin runtime's root)."""
    for prefix in ("sglang.srt.", "hicache_diag.engines.builtin.runtime."):
        if module.startswith(prefix):
            module = module[len(prefix) :]
    return module.replace(".", "/") + ".py"


def receiver_names_class(call: ast.Call, cls: str | None) -> bool:
    """`self.cache_controller.write(...)` names a `*CacheController` (HiCacheController,
    HybridCacheController): the receiver's own name, without underscores, ends the class name."""
    f = call.func
    if cls is None or not isinstance(f, ast.Attribute):
        return False
    recv = f.value
    name = recv.attr if isinstance(recv, ast.Attribute) else getattr(recv, "id", "")
    name = name.replace("_", "").lower()
    return len(name) >= 5 and cls.lower().endswith(name)


@dataclass(slots=True)
class SourceIndex:
    functions: list[Function] = field(default_factory=list)
    by_name: dict[str, list[Function]] = field(default_factory=lambda: defaultdict(list))
    # callee name -> (calling function, the call node)
    calls_to: dict[str, list[tuple[Function, ast.Call]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    # attribute name -> functions that read it (`x.attr` loaded); `self.attr` reads apart
    attr_readers: dict[str, list[Function]] = field(default_factory=lambda: defaultdict(list))
    self_attr_readers: dict[str, list[Function]] = field(default_factory=lambda: defaultdict(list))
    # queue attribute name -> functions that take items from it (`....name.get()`)
    queue_readers: dict[str, list[Function]] = field(default_factory=lambda: defaultdict(list))
    # class name -> its base classes' names (for `self.m()` inherited from a base in scope)
    bases: dict[str, list[str]] = field(default_factory=dict)
    # file -> {name: the file it is imported from}, for `from sglang.srt.x import name`
    imports: dict[str, dict[str, str]] = field(default_factory=dict)
    # file -> names bound by `import torch` / `import numpy as np` of a module outside scope:
    # `torch.tensor(...)` is that module's, never an in-scope function that happens to share
    # the name (the widened scope holds many)
    external: dict[str, set[str]] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    unparsable: list[str] = field(default_factory=list)

    def add_module(self, rel: str, tree: ast.Module) -> None:
        self.files.append(rel)
        self.imports[rel] = {
            alias.asname or alias.name: _module_file(node.module)
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module
            for alias in node.names
        }
        self.external[rel] = {
            (alias.asname or alias.name).split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.Import)
            for alias in node.names
            if not alias.name.startswith(("sglang", "hicache_diag"))
        }
        # `from x import HiCacheController as BaseHiCacheController`: bases by their own name
        renamed = {
            alias.asname: alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
            for alias in node.names
            if alias.asname
        }
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                names = [ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases]
                names = [renamed.get(n, n) for n in names]
                self.bases.setdefault(node.name, names)
                for item in node.body:
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                        self._add(Function(rel, node.name, item.name, item))
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                self._add(Function(rel, None, node.name, node))

    def _add(self, fn: Function) -> None:
        self.functions.append(fn)
        self.by_name[fn.name].append(fn)
        loads: set[str] = set()
        self_loads: set[str] = set()
        queues: set[str] = set()
        for sub in ast.walk(fn.node):
            if isinstance(sub, ast.Call) and (name := callee_name(sub)):
                self.calls_to[name].append((fn, sub))
                if name in ("get", "get_nowait") and isinstance(sub.func, ast.Attribute):
                    recv = sub.func.value
                    if isinstance(recv, ast.Attribute):
                        queues.add(recv.attr)
                    elif isinstance(recv, ast.Name):
                        queues.add(recv.id)
            elif isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Load):
                loads.add(sub.attr)
                if isinstance(sub.value, ast.Name) and sub.value.id == "self":
                    self_loads.add(sub.attr)
        for attr in loads:
            self.attr_readers[attr].append(fn)
        for attr in self_loads:
            self.self_attr_readers[attr].append(fn)
        for q in queues:
            self.queue_readers[q].append(fn)

    def resolve(self, call: ast.Call, caller: Function) -> Function | None:
        """The one in-scope function this call reaches, or None when unknown or ambiguous."""
        name = callee_name(call)
        if not name or name in GENERIC_NAMES:
            return None
        cands = self.by_name.get(name, [])
        f = call.func
        if _root_name(f) in self.external.get(caller.file, ()):
            return None
        if isinstance(f, ast.Attribute) and ast.unparse(f.value) in ("self", "cls"):
            same = [c for c in cands if c.cls == caller.cls and c.file == caller.file]
            if same:
                return same[0]
            if inherited := self._inherited(caller.cls, cands):
                return inherited
            # The Scheduler's mixins call each other's methods through one `self`.
            parts = [c for c in cands if same_object(c.cls, caller.cls)]
            if parts:
                return parts[0]
            return None  # an attribute holding a callable (`self._send_output`): unknown
        if isinstance(f, ast.Name):
            same_file = [c for c in cands if c.cls is None and c.file == caller.file]
            if same_file:
                return same_file[0]
            source = self.imports.get(caller.file, {}).get(name)
            imported = [c for c in cands if c.cls is None and c.file == source]
            if imported:
                return imported[0]
            if hasattr(builtins, name):  # `list(...)`, `max(...)`: never a method in scope
                return None
            cands = [c for c in cands if c.cls is None]  # a bare name is no method
        if len(cands) == 1:
            return cands[0]
        named = [c for c in cands if receiver_names_class(call, c.cls)]
        return named[0] if len(named) == 1 else None

    def ancestors(self, cls: str | None) -> list[str]:
        """`cls`'s base classes in scope, breadth first (close enough to the MRO here)."""
        queue, out = list(self.bases.get(cls or "", [])), []
        while queue:
            base = queue.pop(0)
            if base not in out:
                out.append(base)
                queue.extend(self.bases.get(base, []))
        return out

    def _inherited(self, cls: str | None, cands: list[Function]) -> Function | None:
        """The definition a `self.m()` in `cls` reaches through its bases."""
        for base in self.ancestors(cls):
            found = [c for c in cands if c.cls == base]
            if found:
                return found[0]
        return None

    def callers(self, fn: Function) -> list[tuple[Function, ast.Call]]:
        """Call sites that may reach `fn`: a `self.` call in its own class, or any call by its
        name when the name is specific (one definition in scope, not a dict/list method)."""
        out = []
        unique = len(self.by_name.get(fn.name, [])) == 1 and fn.name not in GENERIC_NAMES
        for caller, call in self.calls_to.get(fn.name, []):
            f = call.func
            on_self = isinstance(f, ast.Attribute) and ast.unparse(f.value) in ("self", "cls")
            if on_self and caller.cls == fn.cls and caller.file == fn.file:
                out.append((caller, call))
            elif (unique or receiver_names_class(call, fn.cls)) and caller is not fn:
                out.append((caller, call))
        return out


def _root_name(f: ast.expr) -> str | None:
    """`torch` for `torch.distributed.all_reduce`; None for a bare name or `self.x`."""
    if not isinstance(f, ast.Attribute):
        return None
    while isinstance(f, ast.Attribute):
        f = f.value
    return f.id if isinstance(f, ast.Name) else None


def build_index(root: Path, patterns: tuple[str, ...], display_base: Path) -> SourceIndex:
    index = SourceIndex()
    seen: set[Path] = set()
    for pattern in patterns:
        for path in sorted(root.glob(pattern)):
            if path in seen or not path.is_file():
                continue
            seen.add(path)
            rel = path.relative_to(display_base).as_posix()
            try:
                tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            except (SyntaxError, UnicodeDecodeError, ValueError):
                index.unparsable.append(rel)
                continue
            index.add_module(rel, tree)
    return index
