"""The SGLang source trees an export reads (never imports): the run's release, for file:line,
and every release at hand, for the range of releases with the same code shape."""

from __future__ import annotations

import os
from pathlib import Path

from hicache_diag.errors import UsageError
from hicache_diag.options.release_order import release_key

RELEASES_ENV = "HICACHE_DIAG_SGLANG_RELEASES"  # dir of unzipped wheels: <version>/sglang/


def releases() -> dict[str, Path]:
    """version -> sglang package dir, for each unzipped release under $HICACHE_DIAG_SGLANG_RELEASES
    and each venv under $HICACHE_DIAG_SGLANG_VENVS (sorted by version)."""
    found: dict[str, Path] = {}
    if root := os.environ.get(RELEASES_ENV):
        for d in Path(root).glob("*/sglang"):
            if (d / "srt").is_dir():
                found[d.parent.name] = d
    if root := os.environ.get("HICACHE_DIAG_SGLANG_VENVS"):
        for d in Path(root).glob("sglang-*/lib/python3*/site-packages/sglang"):
            version = d.parents[3].name.removeprefix("sglang-")
            if (d / "srt").is_dir():
                found.setdefault(version, d)
    return dict(sorted(found.items(), key=lambda kv: release_key(kv[0])))


def run_release(version: str, python: str | None, engine: str = "sglang") -> Path | None:
    """The run's release source: the run's interpreter if it is still there and holds that
    version, else an unzipped or venv copy of that version, else this Python's SGLang if it is
    that version. None: no copy here (the report then quotes the traceback's lines only). The
    interpreter's tree is the run's engine's to find (its registry entry's `sources`)."""
    from hicache_diag.engines.registry import engine as engine_entry

    def python_tree(py: str | None):
        return engine_entry(engine).sources(None, py)

    if python and Path(python).is_file():
        try:
            tree = python_tree(python)
            if tree.version == version:
                return tree.root
        except UsageError:
            pass
    if version in (known := releases()):
        return known[version]
    try:
        tree = python_tree(None)
    except UsageError:
        return None
    return tree.root if tree.version == version else None


def install_command(version: str) -> str:
    """The one command that installs release `version` where the export finds it."""
    from hicache_diag.engines.registry import release_engine

    return release_engine().releases.install_command(version)
