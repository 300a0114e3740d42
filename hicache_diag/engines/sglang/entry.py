"""The sglang engine's registration: names its options, build, trial, source tree and warm
pool; torch and SGLang load only when a trial runs or a pool is made."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from hicache_diag.engines.registry import EngineEntry, Releases, register_engine
from hicache_diag.engines.sglang.options import SglangOptions

if TYPE_CHECKING:
    from hicache_diag.trials.trial import TrialResult


@register_engine("sglang", SglangOptions)
def _sglang() -> EngineEntry:
    from hicache_diag.engines.sglang.build import build
    from hicache_diag.engines.sglang.release import VENVS_ENV
    from hicache_diag.engines.sglang.source_tree import sglang_engine_tree

    def run_sglang_trial(*args: Any) -> TrialResult:
        from hicache_diag.engines.sglang.trial import (
            run_sglang_trial,  # torch: only when a trial runs
        )

        return run_sglang_trial(*args)

    def warm_sglang(root: Path) -> Any:
        from hicache_diag.engines.sglang.warm import WarmSglang  # torch: only when a pool is made

        return WarmSglang(root)

    preload = ("hicache_diag.engines.sglang.trial",)
    return EngineEntry(
        "sglang",
        build,
        run_sglang_trial,
        sglang_engine_tree,
        preload=preload,
        records_reads=True,
        warm=warm_sglang,
        place=_place,
        releases=Releases(_probe, _venv_python, _install_command, VENVS_ENV),
        record=_record,
    )


def _record(record_dir: Path | None, bundle_dir: Path | None, cpu_shims: bool) -> Any:
    from hicache_diag.engines.sglang.record_setup import record_setup

    return record_setup(record_dir, bundle_dir, cpu_shims)


# Each imports its module when called: reading the entry stays free of SGLang's packaging.
def _place(cfg: Any) -> Any:
    if not cfg.hosts:
        return cfg
    from hicache_diag.engines.sglang.remote_nodes import place

    return place(cfg)


def _probe(python: str | None, flag: str) -> str:
    from hicache_diag.engines.sglang.release import probe_sglang

    return probe_sglang(python, flag).version


def _venv_python(version: str) -> str | None:
    from hicache_diag.engines.sglang.release import venv_python_for

    return venv_python_for(version)


def _install_command(version: str) -> str:
    from hicache_diag.engines.sglang.release import release_command

    return release_command(version)
