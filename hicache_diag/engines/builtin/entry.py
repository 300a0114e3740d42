"""The builtin engine's registration: names its options, build, trial, source tree and
switches; the factory imports them only when the engine is first used."""

from __future__ import annotations

from hicache_diag.engines.builtin.options import BuiltinOptions
from hicache_diag.engines.registry import EngineEntry, register_engine


@register_engine("builtin", BuiltinOptions)
def _builtin() -> EngineEntry:
    from hicache_diag.engines.builtin.build import build, protocol_switches
    from hicache_diag.engines.builtin.engine import run_builtin_trial
    from hicache_diag.engines.builtin.rank_main import RANK_PRELOAD
    from hicache_diag.engines.builtin.source_tree import builtin_engine_tree

    preload = ("hicache_diag.engines.builtin.engine", *RANK_PRELOAD)
    return EngineEntry(
        "builtin",
        build,
        run_builtin_trial,
        builtin_engine_tree,
        switches=protocol_switches,
        preload=preload,
    )
