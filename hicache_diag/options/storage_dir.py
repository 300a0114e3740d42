"""The L3 directory an option names, checked on this host before any rank starts (both engines:
the builtin runtime's HiCacheFile and SGLang's `file` backend write there)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hicache_diag.errors import UsageError

FLAG = "--hicache-storage-dir"


def check_storage_dir(path: str, before_start: bool = False) -> str:
    """Create `path` if missing and prove it is a writable directory; else UsageError.
    `before_start` (the CLI, before any rank): also never inside another run's directory (its
    pages would land among that run's evidence)."""
    from hicache_diag.evidence.paths import name_fits

    name_fits(FLAG, path)
    if before_start:
        refuse_run_dir(path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"{FLAG} {path!r} is not a directory")
    try:
        os.makedirs(path, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".hicache-probe-", dir=path)
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        raise UsageError(f"{FLAG} {path!r} is not writable: {e.strerror or e}") from None
    return path


def refuse_run_dir(path: str) -> None:
    """`path`, or a folder above it, is a run directory (its manifest, launcher.json, verdict or
    rank files are there): refused, the run named."""
    from hicache_diag.evidence.output_paths import is_run_dir

    p = Path(os.path.abspath(path))
    try:
        p = p.parent.resolve() / p.name
    except (OSError, RuntimeError):
        pass
    for folder in (p, *p.parents):
        if is_run_dir(folder):
            raise UsageError(
                f"{FLAG} {path!r} is inside the run directory {str(folder)!r}; L3 pages are "
                "never written among a run's evidence: give another folder"
            )
