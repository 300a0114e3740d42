"""The engines, registered by name: each factory imports its engine package lazily, so the CLI
reads names, options and help without torch or SGLang. The contract an engine implements is
trials/engine.py; the options it takes are its own options class (the common RunOptions of
options/run_options.py plus its fields), which its entry names."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from hicache_diag.errors import UsageError
from hicache_diag.options.no_effect import refuse_no_effect
from hicache_diag.options.parse import CommandLine, parse_run_options
from hicache_diag.options.run_options import RunOptions, field_names, flag_of

if TYPE_CHECKING:
    from hicache_diag.faults import Scenario
    from hicache_diag.trials.engine import EngineConfig, Progress
    from hicache_diag.trials.trial import TrialResult


T = TypeVar("T")


class Registry(Generic[T]):
    """`@REG.register("name")` on a zero-argument factory; `REG.get("name")` (or `REG["name"]`)
    calls it once and keeps what it made."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._factories: dict[str, Callable[[], T]] = {}
        self._made: dict[str, T] = {}

    def register(self, name: str) -> Callable[[Callable[[], T]], Callable[[], T]]:
        def add(factory: Callable[[], T]) -> Callable[[], T]:
            if name in self._factories:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._factories[name] = factory
            return factory

        return add

    def names(self) -> tuple[str, ...]:
        return tuple(self._factories)

    def get(self, name: str) -> T:
        if name not in self._factories:
            valid = ", ".join(self._factories)
            raise UsageError(f"unknown --{self.kind} {name!r}; valid: {valid}")
        if name not in self._made:
            self._made[name] = self._factories[name]()
        return self._made[name]

    __getitem__ = get

    def __contains__(self, name: object) -> bool:
        return name in self._factories

    def __iter__(self) -> Iterator[str]:
        return iter(self._factories)


def _as_placed(cfg: Any) -> Any:
    return cfg


@dataclass(frozen=True, slots=True)
class Releases:
    """How an engine that runs a release finds one (`--sglang-python`, `--sglang-version`,
    `hunt --release`): the version a Python holds (`probe(python, flag)`; None: this one), the
    Python of a version's venv under `$<venvs_env>` (None: none there), and the one command
    that makes that venv."""

    probe: Callable[[str | None, str], str]
    venv_python: Callable[[str], str | None]
    install_command: Callable[[str], str]
    venvs_env: str


@dataclass(frozen=True, slots=True)
class EngineEntry:
    """One engine. `options`: its run options class (its flags, defaults and checks), named
    where it registers (`register_engine`); `build(options)` checks everything and returns the
    engine's config (bad input: UsageError, before anything starts); `trial(cfg, argv,
    on_progress)` runs one trial, verdict.json written last; `source_tree(source, python)`:
    the tree `sources` scans; `records_reads`: its ranks record each divergence source they
    read, per step (what `sources --run` compares)."""

    name: str
    build: Callable[[Any], EngineConfig]
    trial: Callable[..., TrialResult]
    source_tree: Callable[[Path | None, str | None], Any]
    switches: Callable[[], Mapping[str, Any]] = field(default=dict)  # its --switch switches
    preload: tuple[str, ...] = ()  # modules a warm trial server imports for its trials
    records_reads: bool = False
    # `--warm-server`: warm(root) -> its pool (trials/warm_trials.py WarmPool); None: none.
    warm: Callable[[Path], Any] | None = None
    # `run --hosts`: place(cfg) checks the hosts and places the nodes before anything starts.
    place: Callable[[Any], Any] = _as_placed
    releases: Releases | None = None  # None: the engine runs no release of anyone's
    # `hicache-diag record`: record(record_dir, bundle_dir, cpu_shims) -> the environment that
    # loads the engine's recorder into a server the user launches; None: it has none.
    record: Callable[..., Any] | None = None

    @property
    def options(self) -> type[RunOptions]:
        return OPTIONS[self.name]

    def sources(self, source: Path | None, python: str | None) -> Any:
        return self.source_tree(source, python)


# A factory imports only what builds and names its engine, never torch or SGLang: an entry's
# facts (records_reads, switches) are read by bad-input refusals, which stay fast.
ENGINES: Registry[EngineEntry] = Registry("engine")
# Each engine's run options class, given when it registers: flags, help and checks read it
# without making the entry.
OPTIONS: dict[str, type[RunOptions]] = {}


def register_engine(
    name: str, options: type[RunOptions]
) -> Callable[[Callable[[], EngineEntry]], Callable[[], EngineEntry]]:
    """`@register_engine("name", ItsOptions)` on the engine's entry factory (its entry.py)."""

    def add(factory: Callable[[], EngineEntry]) -> Callable[[], EngineEntry]:
        OPTIONS[name] = options
        return ENGINES.register(name)(factory)

    return add


# One name per engine folder: `engines/NAME/entry.py` registers it (a new engine is one folder
# and one name here). Imported by name, after ENGINES exists: an entry imports this module.
ENGINE_PACKAGES = ("builtin", "sglang")
for _name in ENGINE_PACKAGES:
    import_module(f"hicache_diag.engines.{_name}.entry")


def engine(name: str) -> EngineEntry:
    return ENGINES.get(name)


def release_engine() -> EngineEntry:
    """The engine that runs releases (flags and axes that pick a release are its)."""
    return next(e for e in map(engine, ENGINES) if e.releases is not None)


def release_trees() -> tuple[Callable[[str | None], Any], dict[str, Callable[[], Any]]]:
    """For `sources --diff`: a release's tree by its Python, and each release-less engine's
    own tree by the engine's name."""
    rel = release_engine()
    named = {n: partial(engine(n).sources, None, None) for n in ENGINES if n != rel.name}
    return partial(rel.sources, None), named


def require_recorded_reads(name: str) -> None:
    """`sources --run` compares the reads a run's ranks recorded: refused (exit 2) for an
    engine whose ranks record none."""
    if not engine(name).records_reads:
        takes = " or ".join(n for n in ENGINES if engine(n).records_reads)
        raise UsageError(
            f"--run reads the sources a run's ranks recorded, which the {name} engine does not "
            f"record: drop --engine, or use --engine {takes}"
        )


def record_setup(record_dir: Path | None, bundle_dir: Path | None, cpu_shims: bool) -> Any:
    """`hicache-diag record`: the recording engine's setup (its `RecordSetup`)."""
    entry = next(e for e in map(engine, ENGINES) if e.record is not None)
    assert entry.record is not None
    return entry.record(record_dir, bundle_dir, cpu_shims)


def release_options() -> type[RunOptions]:
    """The release engine's options class, read without building its entry (--help stays
    fast): the one whose options pick a release by its Python."""
    return next(c for c in option_classes().values() if "sglang_python" in field_names(c))


def takes_releases(name: str) -> bool:
    """Whether engine `name` runs a release picked by --sglang-python / --sglang-version."""
    return engine(name).releases is not None


def require_releases(name: str, flags: str) -> None:
    """`flags` pick releases: refused (exit 2) unless the engine `name` runs one."""
    if not takes_releases(name):
        takes = " or ".join(n for n in ENGINES if takes_releases(n))
        raise UsageError(f"{flags} pick SGLang releases: add --engine {takes}")


def option_classes() -> dict[str, type[RunOptions]]:
    """Each engine's run options class by name, the default engine (the first) first."""
    return {name: OPTIONS[name] for name in ENGINES}


DEFAULT_ENGINE = ENGINE_PACKAGES[0]


def run_options(
    line: CommandLine | None = None, scenario: Scenario | None = None, **values: Any
) -> RunOptions:
    """The run options of a command line (the CLI's flags, typed) over a scenario file; or, from
    code, of `values` by field name (`engine=` picks the engine). Every check done."""
    if line is None:
        name = values.pop("engine", None)
        how = {n: flag_of(type_of(n), n) for n in values}
        line = CommandLine(values, how, name)
    return parse_run_options(line, scenario, option_classes())


def type_of(name: str) -> type[RunOptions]:
    """The options class that declares field `name` (the common one first)."""
    return next(
        (c for c in (RunOptions, *option_classes().values()) if name in field_names(c)),
        RunOptions,
    )


def tie_tolerance(name: str | None) -> float:
    """The tie tolerance of engine `name` (a manifest's; None or unknown: the default engine's),
    for re-reading a run whose reference records none (diagnosis/outputs.py)."""
    return OPTIONS[name if name in ENGINES else DEFAULT_ENGINE].tie_tolerance


def build(options: RunOptions) -> EngineConfig:
    """The options' engine builds its config from them; a variant made from parsed options (a
    bisect cell, a hunt trigger, a shrink candidate) meets the no-effect rules here."""
    return engine(options.engine).build(refuse_no_effect(options))


def run_trial(
    cfg: EngineConfig, argv: list[str] | None = None, on_progress: Progress | None = None
):
    """One trial of whichever engine built `cfg`."""
    return engine(cfg.engine).trial(cfg, argv, on_progress)


def default_help(key: str) -> str:
    """A run flag's default as --help states it: one value, or each engine's where they differ."""
    values = {n: getattr(c(), key) for n, c in option_classes().items() if key in field_names(c)}
    if len(set(map(str, values.values()))) == 1:
        return str(next(iter(values.values())))
    return "; ".join(f"{v} ({name})" for name, v in values.items())


def protocol_switches() -> Mapping[str, Any]:
    """Every engine's protocol switches (`--switch NAME=MODE`), by name: the CLI's help and
    bisect read them here, not from an engine package."""
    with_switches = [n for n, cls in OPTIONS.items() if "switches" in field_names(cls)]
    return {k: v for name in with_switches for k, v in engine(name).switches().items()}
