"""The plugin's first step in every process of a launch (site/sitecustomize.py): as little as
possible until SGLang itself is imported.

A run's launch (`run --engine sglang`: its config file named in the environment) boots at once,
as it always has. A production recording (`hicache-diag record`, or its environment in a
manifest, where every Python process of the image may carry it) boots only when a process
first looks for `sglang`: a process that never imports SGLang loads nothing more than this.
"""

from __future__ import annotations

import os

from hicache_diag.engines.sglang.plugin.config import ENV_VAR
from hicache_diag.engines.sglang.plugin.post_import import before_import


def start() -> None:
    if os.environ.get(ENV_VAR):
        _boot()
    else:
        before_import("sglang", _boot)


def _boot() -> None:
    from hicache_diag.engines.sglang.plugin.boot import boot

    boot()
