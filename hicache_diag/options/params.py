"""A command-line option's face, declared once: its flag, other spellings, metavar, help line
and `--help` panel. A run option's `Param` sits on its field (`option(default, Param(...))`), so
the field, its type, its default and its flag are one declaration; the CLI makes each command's
flags from these (cli/params.py) and checks read them back by the same objects, never by a
name written twice. No typer here: the options layer stays importable without the CLI."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import Field, dataclass, field, fields, replace
from typing import Any

# The `run --help` panels, in the order they are shown; an engine's own options get a panel
# named after the engine (its options class says which).
COMMON = "Common"
FAULTS = "Faults"
CACHE = "Cache (device pool, HiCache host pool and L3 storage)"
OUTPUT = "Output"
PANELS = (COMMON, FAULTS, CACHE, OUTPUT)


@dataclass(frozen=True, slots=True)
class Param:
    """One option as typed on a command line. `aliases`: other spellings, shown in --help;
    `deprecated`: old spellings still read (hidden; each use warns once, naming `flag`);
    `default_text`: the default as --help states it, where the value itself says nothing (None
    meaning "the run dir", an automatic budget). `panel` None: the engine's own panel."""

    flag: str
    help: str
    metavar: str | None = None
    panel: str | None = None
    aliases: tuple[str, ...] = ()
    deprecated: tuple[str, ...] = ()
    default_text: str | None = None

    def __str__(self) -> str:
        return self.flag

    @property
    def spellings(self) -> tuple[str, ...]:
        return (self.flag, *self.aliases, *self.deprecated)


def option(
    default: Any,
    param: Param | None,
    *,
    scenario: bool = True,
    scenario_key: str | None = None,
    scenario_kind: tuple[type, ...] | None = None,
) -> Any:
    """A run-option field: its default and its `Param` (None: no flag). `scenario`: whether a
    scenario file may set it, under `scenario_key` (the field's name unless given), typed as
    `scenario_kind` where the field's own type would not say (a size given as an int)."""
    meta: dict[str, Any] = {"param": param, "scenario": scenario}
    if scenario_key is not None:
        meta["scenario_key"] = scenario_key
    if scenario_kind is not None:
        meta["scenario_kind"] = scenario_kind
    return field(default=default, metadata=meta)


def again(cls: type, name: str, default: Any) -> Any:
    """Field `name` of `cls` declared again with another default (an engine's own default of
    a common option): the same Param, the same scenario rules."""
    base = next(f for f in fields(cls) if f.name == name)
    return field(default=default, metadata=base.metadata)


def param_of(f: Field) -> Param | None:
    return f.metadata.get("param")


def params(cls: type) -> Iterator[tuple[Field, Param]]:
    """The fields of `cls` that have a flag, in declaration order."""
    for f in fields(cls):
        param = param_of(f)
        if param is not None:
            yield f, param


# Reaching other machines: one meaning each in run (its nodes), bisect (its trials) and triage
# (its samples), all through hicache_diag/cluster's executors; each command refuses the
# executors it cannot use (docs/cluster.md).
VIA = Param(
    "--via",
    "How other machines are reached: ssh (--hosts), slurm (--jobid), kubectl (--selector) or "
    "local; default: the one those flags (or $SLURM_JOB_ID) name, else local.",
    "EXECUTOR",
)
HOSTS = Param(
    "--hosts",
    "The machines: names from your ssh config (pod names with kubectl); --out on a path they "
    "all share.",
    "A,B",
)
SSH_CONFIG = Param("--ssh-config", "ssh -F FILE.", "FILE")


def restated(cls: type, name: str, help: str, metavar: str | None = None) -> Param:
    """Field `name`'s option as another command takes it (bisect's axis of values, the Python
    `sources` scans): the same flag and spellings, declared once on the field; its own help."""
    base = field_param(cls, name)
    return replace(base, help=help, metavar=metavar or base.metavar, panel=None)


def field_param(cls: type, name: str) -> Param:
    """The Param of field `name` of `cls` (a check that reads that option names it so)."""
    return next(p for f, p in params(cls) if f.name == name)
