"""The engines, registered by name: each factory imports its engine package lazily, so the CLI
reads names, options and help without torch or SGLang. The contract an engine implements is
harness/engine.py; the options it takes are run_options.py's."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hicache_diag.errors import UsageError
from hicache_diag.registry import Registry
from hicache_diag.run_options import ENGINE_OPTIONS, RunOptions, field_names

if TYPE_CHECKING:
    from hicache_diag.harness.engine import EngineConfig, Progress
    from hicache_diag.harness.trial import TrialResult


@dataclass(frozen=True, slots=True)
class EngineEntry:
    """One engine. `build(options)` checks everything and returns the engine's config (bad
    input: UsageError, before anything starts); `trial(cfg, argv, on_progress)` runs one trial,
    verdict.json written last; `source_tree(source, python)`: the tree `sources` scans;
    `records_reads`: its ranks record each divergence source they read, per step (what
    `sources --run` compares)."""

    name: str
    build: Callable[[Any], EngineConfig]
    trial: Callable[..., TrialResult]
    source_tree: Callable[[Path | None, str | None], Any]
    switches: Callable[[], Mapping[str, Any]] = field(default=dict)  # its --fix switches
    preload: tuple[str, ...] = ()  # modules a warm trial server imports for its trials
    records_reads: bool = False
    # `--warm-server`: warm(root) -> its pool (harness/warm_trials.py WarmPool); None: none.
    warm: Callable[[Path], Any] | None = None

    @property
    def options(self) -> type[RunOptions]:
        return ENGINE_OPTIONS[self.name]

    def sources(self, source: Path | None, python: str | None) -> Any:
        return self.source_tree(source, python)


# A factory imports only what builds and names its engine, never torch or SGLang: an entry's
# facts (records_reads, switches) are read by bad-input refusals, which stay fast.
ENGINES: Registry[EngineEntry] = Registry("engine")


@ENGINES.register("builtin")
def _builtin() -> EngineEntry:
    from hicache_diag.builtin.build import build, protocol_switches
    from hicache_diag.builtin.engine import run_builtin_trial
    from hicache_diag.builtin.rank_main import RANK_PRELOAD
    from hicache_diag.sources.locate import builtin_engine_tree

    preload = ("hicache_diag.builtin.engine", *RANK_PRELOAD)
    return EngineEntry(
        "builtin", build, run_builtin_trial, builtin_engine_tree, protocol_switches, preload
    )


@ENGINES.register("sglang")
def _sglang() -> EngineEntry:
    from hicache_diag.sglang.build import build
    from hicache_diag.sglang.source_tree import sglang_engine_tree

    def run_sglang_trial(*args: Any) -> TrialResult:
        from hicache_diag.sglang.trial import run_sglang_trial  # torch: only when a trial runs

        return run_sglang_trial(*args)

    def warm_sglang(root: Path) -> Any:
        from hicache_diag.sglang.warm import WarmSglang  # torch: only when a pool is made

        return WarmSglang(root)

    preload = ("hicache_diag.sglang.trial",)
    return EngineEntry(
        "sglang",
        build,
        run_sglang_trial,
        sglang_engine_tree,
        preload=preload,
        records_reads=True,
        warm=warm_sglang,
    )


def engine(name: str) -> EngineEntry:
    return ENGINES.get(name)


def require_recorded_reads(name: str) -> None:
    """`sources --run` compares the reads a run's ranks recorded: refused (exit 2) for an
    engine whose ranks record none."""
    if not engine(name).records_reads:
        takes = " or ".join(n for n in ENGINES if engine(n).records_reads)
        raise UsageError(
            f"--run reads the sources a run's ranks recorded, which the {name} engine does not "
            f"record: drop --engine, or use --engine {takes}"
        )


def takes_releases(name: str) -> bool:
    """Whether engine `name` runs a release picked by --sglang-python / --sglang-version."""
    return "sglang_python" in field_names(ENGINE_OPTIONS[name])


def require_releases(name: str, flags: str) -> None:
    """`flags` pick releases: refused (exit 2) unless the engine `name` runs one."""
    if not takes_releases(name):
        takes = " or ".join(n for n in ENGINES if takes_releases(n))
        raise UsageError(f"{flags} pick SGLang releases: add --engine {takes}")


def build(options: RunOptions) -> EngineConfig:
    """The options' engine builds its config from them."""
    return engine(options.engine).build(options)


def run_trial(
    cfg: EngineConfig, argv: list[str] | None = None, on_progress: Progress | None = None
):
    """One trial of whichever engine built `cfg`."""
    return engine(cfg.engine).trial(cfg, argv, on_progress)


def default_help(key: str) -> str:
    """A run flag's default as --help states it: one value, or each engine's where they differ."""
    values = {n: getattr(c(), key) for n, c in ENGINE_OPTIONS.items() if key in field_names(c)}
    if len(set(map(str, values.values()))) == 1:
        return str(next(iter(values.values())))
    return "; ".join(f"{v} ({name})" for name, v in values.items())


def protocol_switches() -> Mapping[str, Any]:
    """Every engine's protocol switches (`--fix NAME=MODE`), by name: the CLI's help and bisect
    read them here, not from an engine package."""
    with_fix = [n for n, cls in ENGINE_OPTIONS.items() if "fix" in field_names(cls)]
    return {k: v for name in with_fix for k, v in engine(name).switches().items()}
