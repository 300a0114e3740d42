"""The L3 directory an option names, checked on this host before any rank starts (both engines:
the builtin runtime's HiCacheFile and SGLang's `file` backend write there)."""

from __future__ import annotations

import os
import tempfile

from hicache_diag.errors import UsageError


def check_storage_dir(path: str) -> str:
    """Create `path` if missing and prove it is a writable directory; else UsageError."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"--hicache-storage-dir {path!r} is not a directory")
    try:
        os.makedirs(path, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".hicache-probe-", dir=path)
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        raise UsageError(
            f"--hicache-storage-dir {path!r} is not writable: {e.strerror or e}"
        ) from None
    return path
