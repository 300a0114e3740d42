"""Where a mechanism's steps are in one release's source: file:line found by ast in that tree,
never remembered from another release (line numbers move every release)."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Step:
    """One step of a mechanism: `snippet` is a piece of source text inside `function` (a
    method of `cls`) in `file` (relative to the sglang package); `says` is what it does.
    `alt`: other (function, snippet) places the same step has in other releases."""

    file: str
    cls: str
    function: str
    snippet: str
    says: str
    alt: tuple[tuple[str, str], ...] = ()


@lru_cache(maxsize=32)
def _parsed(path: Path) -> tuple[ast.Module, tuple[str, ...]] | None:
    try:
        text = path.read_text(errors="replace")
        return ast.parse(text), tuple(text.splitlines())
    except (OSError, SyntaxError, ValueError):
        return None


def _function(module: ast.Module, cls: str, name: str) -> ast.FunctionDef | None:
    for node in module.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return item
    return None


def locate(package: Path, step: Step) -> tuple[str, int] | None:
    """(function, line) of the step in this tree (its own place first, then `alt`), or None if
    it is not there (the release does not have this step)."""
    parsed = _parsed(package / step.file)
    if parsed is None:
        return None
    module, lines = parsed
    for name, snippet in ((step.function, step.snippet), *step.alt):
        fn = _function(module, step.cls, name)
        if fn is None:
            continue
        for lineno in range(fn.lineno, (fn.end_lineno or fn.lineno) + 1):
            if snippet in lines[lineno - 1]:
                return name, lineno
    return None


def present(package: Path, steps: tuple[Step, ...]) -> bool:
    """Whether every step of a mechanism is in this tree (the same code shape)."""
    return all(locate(package, s) is not None for s in steps)
