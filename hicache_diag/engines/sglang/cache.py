"""The tool's cache directory and the one way things are built into it.

`$HICACHE_DIAG_CACHE`, else `$XDG_CACHE_HOME/hicache-diag`, else `~/.cache/hicache-diag`.
Everything in it is built on first use and keyed by content, so an empty cache is always a
valid state (CI runs on one).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def cache_root() -> Path:
    base = os.environ.get("HICACHE_DIAG_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "hicache-diag"
    )
    return Path(base)


def build_once(target: Path, build: Callable[[Path], None], *, marker: str) -> Path:
    """`target`, built by `build(scratch_dir)` unless `target/marker` exists already. The build
    goes to a scratch dir that is renamed into place, so two first uses at once never see half
    a build; a failed build leaves nothing behind."""
    if (target / marker).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".build-", dir=target.parent))
    try:
        build(scratch)
        try:
            scratch.rename(target)
        except OSError:  # another process won the race; its copy is identical
            pass
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target
