"""The builtin engine's source tree for `sources`: our runtime (engines/builtin/runtime/)."""

from __future__ import annotations

from pathlib import Path

from hicache_diag.errors import UsageError
from hicache_diag.sources.locate import Tree
from hicache_diag.sources.rules import BUILTIN_SCOPE


def builtin_tree() -> Tree:
    import hicache_diag
    from hicache_diag.engines.builtin import runtime

    return Tree("builtin", Path(runtime.__file__).parent, hicache_diag.__version__, BUILTIN_SCOPE)


def builtin_engine_tree(source: Path | None, python: str | None) -> Tree:
    """`sources --engine builtin`: our runtime, nothing else to name."""
    if source is not None or python is not None:
        raise UsageError("--engine builtin scans our runtime: drop --source/--sglang-python")
    return builtin_tree()
