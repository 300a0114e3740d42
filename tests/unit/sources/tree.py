"""Tiny synthetic SGLang-shaped trees (our own code, written for these tests), and their scan."""

from __future__ import annotations

import textwrap
from pathlib import Path

from hicache_diag.sources.locate import source_tree
from hicache_diag.sources.scan import scan_tree


def write_tree(root: Path, files: dict[str, str], version: str = "9.9.9") -> Path:
    """`files` maps paths under sglang/srt/ to source text; returns the sglang package dir."""
    pkg = root / "sglang"
    for rel, text in files.items():
        path = pkg / "srt" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    (pkg / "version.py").write_text(f'__version__ = "{version}"\n')
    return pkg


def scan(root: Path, files: dict[str, str]):
    return scan_tree(source_tree(write_tree(root, files)))


def only(inv, **match):
    """The one source whose attributes equal `match` (fails with the list when not exactly one)."""
    found = [s for s in inv.sources if all(getattr(s, k) == v for k, v in match.items())]
    assert len(found) == 1, [(s.function, s.kind, s.line) for s in inv.sources]
    return found[0]
