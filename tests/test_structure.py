"""The house's walls, read from the source with `ast` (docs/structure.md).

Four checks over `hicache_diag/`, `cli/` (hicache_diag.cli) and `faults/` (hicache_diag.faults):
- no import circle among all imports: module level, function bodies (a lazy import closes a
  circle as soon as the function is called) and `if TYPE_CHECKING:` (an annotation-only import
  still ties the two modules' meaning: each needs the other to be read);
- every import points down the layers (`LAYERS`), and no import crosses a `WALLS` pair;
- below the engines layer, no comparison with an engine's name (`engine == "sglang"`): what
  differs per engine is an attribute of its entry or its options, or a function it supplies;
- no file over 400 lines, no function over 50 lines (def line to last line, decorators left out).
Each check has an allow-list with a reason per entry: today's offenders, being fixed in parallel
in issue 30; the lead empties the lists at merge. An allow-listed entry that no longer offends
fails too, so the lists only shrink.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Where each installed package lives in the tree (pyproject's package-dir).
PACKAGE_DIRS = {
    "hicache_diag": "hicache_diag",
    "cli": "hicache_diag.cli",
    "faults": "hicache_diag.faults",
}

MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 50

# Each engine's own folder under engines/ (`engines.builtin`, `engines.sglang`, ...), found on
# disk: a new engine is a folder and its name in the registry, not a row here.
ENGINE_FOLDERS = tuple(
    sorted(
        f"engines.{p.name}"
        for p in (ROOT / "hicache_diag" / "engines").iterdir()
        if (p / "__init__.py").is_file()
    )
)

# The layers, top to bottom, by unit: `cli`, `faults`, the name right under hicache_diag (a
# package or a module; "__init__" is hicache_diag/__init__.py), and under engines/ each engine's
# own folder (ENGINE_FOLDERS; `engines` is the registry they register in). An import may only
# point to a strictly lower layer: units on one layer are peers and never import each other
# (the engines, docs/structure.md).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("cli",),  # parse, call one function, render
    ("hunt",),  # the hunt loop: trials per trigger, then a shrink and an export of what failed
    # Above the registry: the engines (each registers itself) and what builds on any engine
    ("export", "shrink", *ENGINE_FOLDERS),
    ("engines",),  # the registry: what `run`, bisect and hunt ask of an engine
    ("trials",),  # the one engine-blind trial loop, the Engine base, bisect, rate check, warm
    ("triage",),  # live and offline triage (a production recording read with diagnosis' code)
    ("diagnosis",),  # a run directory read back
    ("logs", "options"),  # what a server printed, as delivered; the run vocabulary
    ("faults", "rules", "sources"),  # faults and their hook points; the rule book; inventory
    ("cluster", "evidence"),  # reaching other nodes; the record types and files of a run
    ("errors", "__init__"),
)

# Pairs (importer unit, imported unit) kept apart even though the import would point down.
WALLS: dict[tuple[str, str], str] = {
    (src, dst): "the CLI and the hunt reach an engine only through the registry (engines/)"
    for src in ("cli", "hunt")
    for dst in ENGINE_FOLDERS
}

_LEAD = "being split in issue 30 (owner: lead)"
_OTHER = "being split in issue 30 (owner: lead or the issue-30 helper on that package)"

# Edges `importer -> imported` (module names under hicache_diag) that break a layer or a wall
# today.
LAYER_ALLOW: dict[str, str] = {}

# Files over MAX_FILE_LINES and functions (`path::qualname`) over MAX_FUNCTION_LINES today.
FILE_ALLOW: dict[str, str] = {}
FUNCTION_ALLOW: dict[str, str] = {}

# Comparisons with an engine's name below the engines layer (`path: comparison`) today.
ENGINE_NAME_ALLOW: dict[str, str] = {}


def _module_files() -> dict[str, Path]:
    mods: dict[str, Path] = {}
    for folder, package in PACKAGE_DIRS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join([package, *parts])] = path
    return mods


def _imports(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements in `body`: module level, function bodies (a lazy import ties
    modules as soon as the function is called) and `if TYPE_CHECKING:` blocks alike."""
    for stmt in body:
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            yield stmt
            continue
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            sub = getattr(stmt, field, None)
            if isinstance(sub, list):
                yield from _imports(sub)


def _targets(name: str, path: Path, stmt: ast.Import | ast.ImportFrom, mods: dict) -> set[str]:
    """Our modules one import statement names. `from pkg import mod` names pkg.mod; the parent
    packages Python loads on the way are not edges (a package's __init__ re-exporting its
    children would otherwise make every package a circle)."""
    if isinstance(stmt, ast.Import):
        return {a.name for a in stmt.names} & mods.keys()
    base = stmt.module or ""
    if stmt.level:
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        package = package[: len(package) - (stmt.level - 1)]
        base = ".".join([*package, base] if base else package)
    found = set()
    for alias in stmt.names:
        child = f"{base}.{alias.name}"
        found.add(child if child in mods else base)
    return found & mods.keys()


@cache
def _graph() -> dict[str, frozenset[str]]:
    mods = _module_files()
    graph = {}
    for name, path in mods.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        edges: set[str] = set()
        for stmt in _imports(tree.body):
            edges |= _targets(name, path, stmt, mods)
        graph[name] = frozenset(edges - {name})
    return graph


def _circles(graph: dict[str, frozenset[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while not component or component[-1] != node:
                        component.append(stack.pop())
                        on_stack.discard(component[-1])
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def _unit(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "__init__"
    if (
        parts[1] == "engines"
        and len(parts) > 2
        and (ROOT / "hicache_diag/engines" / parts[2]).is_dir()
    ):
        return f"engines.{parts[2]}"
    return parts[1]


def _short(module: str) -> str:
    return module.removeprefix("hicache_diag.")


def _layer_breaks(graph: dict[str, frozenset[str]]) -> dict[str, str]:
    """Every import that points up or sideways, or crosses a wall; edge -> why."""
    layer = {unit: depth for depth, units in enumerate(LAYERS) for unit in units}
    breaks = {}
    for importer, imported in sorted(graph.items()):
        for target in sorted(imported):
            src, dst = _unit(importer), _unit(target)
            edge = f"{_short(importer)} -> {_short(target)}"
            if src == dst:
                continue
            if layer[dst] <= layer[src]:
                breaks[edge] = f"{src} (layer {layer[src]}) imports {dst} (layer {layer[dst]})"
            elif (src, dst) in WALLS:
                breaks[edge] = f"wall {src} -> {dst}: {WALLS[(src, dst)]}"
    return breaks


def _engine_name_compares(source: str, names: frozenset[str]) -> Iterator[str]:
    """Each comparison of a value with an engine's name: `x == "sglang"`, `x != ...`,
    `x in ("sglang", ...)`, `case "sglang":`, and a table keyed by one (`{"sglang": 5e-3}`). A
    name left of `in` is a substring test (`"sglang" in path`: the package, not the engine)."""

    def named(node: ast.AST) -> bool:
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return any(named(e) for e in node.elts)
        return isinstance(node, ast.Constant) and node.value in names

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.MatchValue) and named(node.value):
            yield f"case {ast.unparse(node.value)}"
        if isinstance(node, ast.Dict) and any(k is not None and named(k) for k in node.keys):
            yield ast.unparse(node)
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        for op, a, b in zip(node.ops, sides, sides[1:], strict=False):
            if (isinstance(op, (ast.Eq, ast.NotEq)) and (named(a) or named(b))) or (
                isinstance(op, (ast.In, ast.NotIn)) and named(b)
            ):
                yield ast.unparse(node)
                break


def _function_lengths(path: Path) -> Iterator[tuple[str, int]]:
    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield prefix + child.name, child.end_lineno - child.lineno + 1
                yield from walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            else:
                yield from walk(child, prefix)

    yield from walk(ast.parse(path.read_text(), filename=str(path)), "")


def _check_allow_list(found: dict[str, str], allowed: dict[str, str], what: str) -> None:
    new = {k: v for k, v in found.items() if k not in allowed}
    stale = sorted(set(allowed) - set(found))
    lines = [f"{what}: {k} ({v})" for k, v in new.items()]
    lines += [f"allow-listed but fixed, remove from the list: {k}" for k in stale]
    if lines:
        pytest.fail("\n".join(lines), pytrace=False)


def test_every_unit_has_a_layer() -> None:
    layered = {unit for units in LAYERS for unit in units}
    missing = sorted({_unit(m) for m in _module_files()} - layered)
    assert not missing, f"units with no layer in LAYERS: {missing}"


def test_no_import_circles() -> None:
    mods = _module_files()
    circles = _circles(_graph())
    listing = [" <-> ".join(str(mods[m].relative_to(ROOT)) for m in circle) for circle in circles]
    assert not circles, "import circles:\n" + "\n".join(listing)


def test_imports_point_down_the_layers() -> None:
    breaks = _layer_breaks(_graph())
    _check_allow_list(breaks, LAYER_ALLOW, "import against the layers")


def test_no_engine_names_below_the_engines_layer() -> None:
    from hicache_diag.engines.registry import ENGINES

    names = frozenset(ENGINES.names())
    depth = {unit: d for d, units in enumerate(LAYERS) for unit in units}
    found = {}
    for module, path in _module_files().items():
        unit = _unit(module)
        # The engines, their registry and what sits above it may name an engine.
        if depth[unit] <= depth["engines"]:
            continue
        for text in _engine_name_compares(path.read_text(), names):
            found[f"{path.relative_to(ROOT)}: {text}"] = "an engine's name as a branch or a key"
    _check_allow_list(found, ENGINE_NAME_ALLOW, "engine named below the engines layer")


def test_no_long_files() -> None:
    found = {}
    for path in _module_files().values():
        lines = len(path.read_text().splitlines())
        if lines > MAX_FILE_LINES:
            found[str(path.relative_to(ROOT))] = f"{lines} lines"
    _check_allow_list(found, FILE_ALLOW, f"file over {MAX_FILE_LINES} lines")


def test_no_long_functions() -> None:
    found = {}
    for path in _module_files().values():
        for qualname, lines in _function_lengths(path):
            if lines > MAX_FUNCTION_LINES:
                found[f"{path.relative_to(ROOT)}::{qualname}"] = f"{lines} lines"
    _check_allow_list(found, FUNCTION_ALLOW, f"function over {MAX_FUNCTION_LINES} lines")


def test_the_checker_sees_a_circle_and_a_layer_break() -> None:
    """The checks can fail: a two-module circle is found, a TYPE_CHECKING import and a
    function-body (lazy) import are edges, an upward import from the runtime into the harness
    is a break, and a branch on an engine's name is seen (a substring test is not)."""
    graph = {"a": frozenset({"b"}), "b": frozenset({"a"}), "c": frozenset({"a"})}
    assert _circles(graph) == [["a", "b"]]
    source = (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import x\nimport y\n"
        "def main():\n    import z\n"
    )
    names = [a.name for s in _imports(ast.parse(source).body) for a in s.names]
    assert names == ["TYPE_CHECKING", "x", "y", "z"]
    up = {
        "hicache_diag.engines.builtin.runtime.m": frozenset(
            {"hicache_diag.engines.sglang.n", "hicache_diag.faults.hooks"}
        )
    }
    assert list(_layer_breaks(up)) == ["engines.builtin.runtime.m -> engines.sglang.n"]
    walled = {"hicache_diag.cli.m": frozenset({"hicache_diag.engines.builtin.runtime.n"})}
    wall = _layer_breaks(walled)["cli.m -> engines.builtin.runtime.n"]
    assert wall.startswith("wall cli -> engines.builtin")
    branches = (
        "if engine == 'sglang' or 'sglang' in path: pass\nok = e not in ('x', 'builtin')\n"
        "match e:\n    case 'builtin':\n        pass\ntol = {'sglang': 5e-3}\n"
    )
    assert sorted(_engine_name_compares(branches, frozenset({"sglang", "builtin"}))) == [
        "case 'builtin'",
        "e not in ('x', 'builtin')",
        "engine == 'sglang'",
        "{'sglang': 0.005}",
    ]
