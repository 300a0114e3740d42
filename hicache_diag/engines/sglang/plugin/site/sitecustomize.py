"""Entry of the hicache-diag plugin in every process of one SGLang launch (ours).

This directory is on PYTHONPATH for that launch only, beside the plugin bundle's library
(engines/sglang/bundle.py): the plugin comes from those files, never from the tool's own
environment, so a release's interpreter imports only its own packages.
"""

import sys


def _boot() -> None:
    try:
        from hicache_diag.engines.sglang.plugin.boot import boot
    except ImportError as exc:  # never break an interpreter over the plugin
        sys.stderr.write(f"hicache-diag plugin not loaded: {exc}\n")
        return
    boot()


_boot()
