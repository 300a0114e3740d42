"""Find the tree to scan: `--source DIR` (each engine names its own default tree:
engines/builtin/source_tree.py, engines/sglang/source_tree.py). Never imports SGLang."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from hicache_diag.errors import UsageError
from hicache_diag.sources.rules import SGLANG_SCOPE, Scope


@dataclass(frozen=True, slots=True)
class Tree:
    engine: str  # the engine it is the source of (Release.engine)
    root: Path  # the sglang package dir, or the builtin engine's runtime/
    version: str
    scope: Scope  # which of its files `scan_tree` reads


def source_tree(path: Path) -> Tree:
    """An unzipped wheel (holding sglang/srt/) or the sglang package dir itself."""
    if path.is_file():
        raise UsageError(f"--source {path}: a file, not a directory (unzip the wheel first)")
    if not path.is_dir():
        raise UsageError(f"--source {path}: no such directory")
    for pkg in (path, path / "sglang"):
        if (pkg / "srt").is_dir():
            return Tree("sglang", pkg.resolve(), _version(pkg), SGLANG_SCOPE)
    raise UsageError(f"--source {path}: no SGLang source there (expected srt/ or sglang/srt/)")


def any_tree(
    spec: str, from_python: Callable[[str], Tree], named: Mapping[str, Callable[[], Tree]]
) -> Tree:
    """For --diff: a tree by the name the caller gives it (`builtin`), a source directory, or a
    Python executable (`from_python`: the sglang engine's own finder, sglang/source_tree.py)."""
    if spec in named:
        return named[spec]()
    path = Path(spec)
    if path.is_dir():
        return source_tree(path)
    if path.is_file():
        return from_python(spec)
    names = " or ".join(repr(n) for n in named)
    raise UsageError(f"--diff {spec}: neither a directory, a Python executable nor {names}")


_VERSION = re.compile(r"""__version__\s*=\s*(?:version\s*=\s*)?["']([^"']+)["']""")


def _version(pkg: Path) -> str:
    for meta in sorted(pkg.parent.glob("sglang-*.dist-info/METADATA")):
        for line in meta.read_text(errors="replace").splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    for name in ("_version.py", "version.py"):
        f = pkg / name
        if f.is_file() and (m := _VERSION.search(f.read_text(errors="replace"))):
            return m.group(1)
    return "unknown"
