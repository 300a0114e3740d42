"""The registry of engines the CLI reads: their names, defaults, bisect trial timeouts, `build`
(RunRequest -> the engine's config) and trial -- the pattern of mini-sglang's registries. It
sits above both engines; the contract they implement is harness/engine.py.

An engine is registered by the dotted names of its `build` and `trial` functions, imported only
when used, so that `--help` and bad-input refusals never import torch or SGLang.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hicache_diag.errors import UsageError
from hicache_diag.harness import builtin
from hicache_diag.harness.engine import EngineConfig, Progress
from hicache_diag.harness.request import RunRequest
from hicache_diag.sglang import defaults as sglang_defaults


@dataclass(frozen=True, slots=True)
class EngineEntry:
    """One engine. `build(request)` checks everything and returns the engine's config (bad
    input: UsageError, before anything starts); `trial(cfg, argv, on_progress)` runs one trial
    and returns harness.trial.TrialResult, verdict.json written last."""

    name: str
    summary: str
    defaults: Mapping[str, Any]
    trial_timeout_s: float
    builder: str  # "module:function"
    trial: str
    # `sources --engine NAME`: "module:function", (--source, --sglang-python) -> sources Tree.
    source_tree: str = ""
    releases: bool = False  # takes a release to run (--sglang-python / --sglang-version)

    def build(self, request: RunRequest) -> EngineConfig:
        return _load(self.builder)(request)

    def run(self, cfg: EngineConfig, argv: list[str] | None, on_progress: Progress | None):
        return _load(self.trial)(cfg, argv, on_progress)

    def sources(self, source: Path | None, python: str | None):
        """The source tree `sources` scans for this engine (sources/locate.py `Tree`)."""
        return _load(self.source_tree)(source, python)


def _load(dotted: str) -> Callable[..., Any]:
    module, attr = dotted.split(":")
    return getattr(importlib.import_module(module), attr)


ENGINES: dict[str, EngineEntry] = {
    "builtin": EngineEntry(
        "builtin", "our compact runtime", builtin.DEFAULTS, builtin.TRIAL_TIMEOUT_S,
        "hicache_diag.harness.builtin:build", "hicache_diag.harness.builtin:run_builtin_trial",
        source_tree="hicache_diag.sources.locate:builtin_engine_tree",
    ),
    "sglang": EngineEntry(
        "sglang", "the real SGLang server",
        sglang_defaults.DEFAULTS,
        sglang_defaults.TRIAL_TIMEOUT_S,
        "hicache_diag.sglang.build:build", "hicache_diag.sglang.trial:run_sglang_trial",
        source_tree="hicache_diag.sources.locate:sglang_engine_tree", releases=True,
    ),
}  # fmt: skip


def engine(name: str) -> EngineEntry:
    try:
        return ENGINES[name]
    except KeyError:
        raise UsageError(f"unknown --engine {name!r}; valid: {', '.join(ENGINES)}") from None


def require_releases(name: str, flags: str) -> None:
    """`flags` pick releases: refused (exit 2) unless the engine `name` runs one."""
    if not engine(name).releases:
        takes = " or ".join(n for n, e in ENGINES.items() if e.releases)
        raise UsageError(f"{flags} pick SGLang releases: add --engine {takes}")


def build(request: RunRequest) -> EngineConfig:
    """The request's engine builds its config from it."""
    return engine(request.engine).build(request)


def run_trial(cfg: EngineConfig, argv: list[str] | None = None,
              on_progress: Progress | None = None):  # fmt: skip
    """One trial of whichever engine built `cfg`."""
    return engine(cfg.engine).run(cfg, argv, on_progress)


def default_help(key: str) -> str:
    """A run flag's default as --help states it: one value, or each engine's where they differ."""
    values = {name: e.defaults.get(key) for name, e in ENGINES.items()}
    if len(set(map(str, values.values()))) == 1:
        return str(values["builtin"])
    return "; ".join(f"{v} ({name})" for name, v in values.items())


def protocol_switches() -> Mapping[str, Any]:
    """The builtin engine's protocol switches (`--fix NAME=MODE`), by name: the CLI's help and
    bisect read them here, not from the runtime."""
    from hicache_diag.runtime.protocol import SWITCHES

    return SWITCHES
