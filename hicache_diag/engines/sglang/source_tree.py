"""The sglang engine's source tree for `sources`: the tree `--source` names, else the SGLang of a
Python (found without importing it: the release probe asks that interpreter)."""

from __future__ import annotations

from pathlib import Path

from hicache_diag.errors import UsageError
from hicache_diag.sources.locate import Tree, source_tree
from hicache_diag.sources.rules import SGLANG_SCOPE


def python_tree(python: str | None) -> Tree:
    from hicache_diag.engines.sglang.release import probe_sglang

    install = probe_sglang(python)
    if not (install.package_dir / "srt").is_dir():
        raise UsageError(f"{install.package_dir}: SGLang there has no srt/ source")
    return Tree("sglang", install.package_dir, install.version, SGLANG_SCOPE)


def sglang_engine_tree(source: Path | None, python: str | None) -> Tree:
    """`sources --engine sglang`: the tree `--source` names, else the SGLang of `python`."""
    return source_tree(source) if source is not None else python_tree(python)
