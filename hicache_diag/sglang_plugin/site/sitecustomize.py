"""Entry of the hicache-diag plugin in every process of one SGLang launch (ours).

This directory is on PYTHONPATH for that launch only. When SGLang runs in another environment
(`--sglang-python`), hicache-diag itself is found through HICACHE_DIAG_SITE, which names the
environment hicache-diag is installed in; it is appended, so SGLang's own packages win.
"""

import os
import site
import sys


def _boot() -> None:
    extra = os.environ.get("HICACHE_DIAG_SITE")
    if extra and extra not in sys.path:
        site.addsitedir(extra)
    try:
        from hicache_diag.sglang_plugin.boot import boot
    except ImportError as exc:  # never break an interpreter over the plugin
        sys.stderr.write(f"hicache-diag plugin not loaded: {exc}\n")
        return
    boot()


_boot()
