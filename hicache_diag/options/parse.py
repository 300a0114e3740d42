"""The one parser of run options: the command line over a scenario file -> the engine's
`RunOptions` (options/run_options.py). `run`, `bisect`, `timeline` and the benches call it;
a bad key, type or flag is one line naming what the user wrote (exit 2)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import fields
from typing import TYPE_CHECKING, Any

from hicache_diag.errors import UsageError
from hicache_diag.options.run_options import (
    DEFAULT_ENGINE,
    ENGINE_OPTIONS,
    ENV_NAME,
    OPTION_ALIASES,
    RunOptions,
    field_names,
)

if TYPE_CHECKING:
    from hicache_diag.faults import Scenario

# Command-line names that are not the field's own, and scenario aliases.
FLAG_FIELDS = {"fault": "faults"}
SCENARIO_FIELDS = {**OPTION_ALIASES, "fix": "scenario_fix"}
# Fields a scenario cannot set (the run dir and the run's own switches are the command's).
NOT_SCENARIO = (
    "out",
    "check",
    "faults",
    "scenario_fix",
    "sglang_consensus_checker",
    "warm_server",
)

_INT, _NUM, _STR, _LIST = (int,), (int, float), (str,), (list,)
_KINDS = {"int": _INT, "int | None": _INT, "float": _NUM, "str": _STR, "str | None": _STR}
_TYPE_WORDS = {
    _INT: "an integer",
    _NUM: "a number",
    _STR: "a string",
    (str, int): 'a size such as "64MiB" or a byte count',
    _LIST: "a list of strings",
    (dict,): 'a table of NAME = "VALUE" strings',
}


def scenario_types() -> dict[str, tuple[type, ...]]:
    """The type each scenario key must have, from the options' own fields (every engine's)."""
    types: dict[str, tuple[type, ...]] = {"engine": _STR}
    for cls in ENGINE_OPTIONS.values():
        for f in fields(cls):
            if f.name in NOT_SCENARIO or f.name == "given":
                continue
            kind = f.metadata.get("scenario") or _KINDS.get(str(f.type), _LIST)
            types[f.name] = kind
    types["fix"] = _LIST
    return types


def _check_type(path: str, key: str, value: Any, want: tuple[type, ...]) -> None:
    ok = isinstance(value, want) and not isinstance(value, bool)
    if ok and want == _LIST:
        ok = all(isinstance(v, str) for v in value)
    if ok and want == (dict,):
        ok = all(
            isinstance(v, str | int | float) and not isinstance(v, bool) for v in value.values()
        )
    if not ok:
        raise UsageError(f"scenario {path!r}: {key} must be {_TYPE_WORDS[want]}, not {value!r}")


def scenario_values(scenario: Scenario | None) -> dict[str, Any]:
    """A scenario's run options by field name, typed as the fields are; its faults first."""
    if scenario is None:
        return {}
    types, path = scenario_types(), str(scenario.path)
    out: dict[str, Any] = {}
    for key, value in scenario.options.items():
        name = SCENARIO_FIELDS.get(key, key)
        want = types.get(key) or types.get(name)
        if want is None:
            valid = ", ".join(sorted({*types, *SCENARIO_FIELDS, "description", "fault"}))
            raise UsageError(f"scenario {path!r}: unknown key {key!r}; valid keys: {valid}")
        _check_type(path, key, value, want)
        out.setdefault(name, _field_value(key, value, path))
    if scenario.faults:
        out["faults"] = scenario.fault_specs()
    return out


def _field_value(key: str, value: Any, path: str) -> Any:
    if isinstance(value, dict):  # sglang_env: NAME = "VALUE"
        bad = next((n for n in value if not ENV_NAME.fullmatch(str(n))), None)
        if bad is not None:
            raise UsageError(f"scenario {path!r}: {key}: {bad!r} is not a variable name")
        return tuple(f"{n}={v}" for n, v in value.items())
    if isinstance(value, list):
        return tuple(value)
    return str(value) if key == "hicache_size" else value


def _flag_values(flags: Mapping[str, Any]) -> dict[str, Any]:
    """The command line's options by field name; None, False and [] are "not given"."""
    names = {n for cls in ENGINE_OPTIONS.values() for n in field_names(cls)} | {"engine"}
    out = {}
    for key, value in flags.items():
        name = FLAG_FIELDS.get(key, key)
        empty = value is None or value is False or (isinstance(value, list | tuple) and not value)
        if name not in names or empty:
            continue
        out[name] = tuple(value) if isinstance(value, list | tuple) else value
    return out


def _owner(name: str) -> str:
    return next(e for e, cls in ENGINE_OPTIONS.items() if name in field_names(cls))


def _refuse_foreign(cls: type[RunOptions], names: Iterable[str], how: dict[str, str]) -> None:
    own = set(field_names(cls))
    for name in names:
        if name in own:
            continue
        why = getattr(cls, "foreign", {}).get(name)
        if why:
            raise UsageError(why.format(how=how[name]))
        owner = _owner(name)
        if how[name].startswith("--"):
            raise UsageError(f"{how[name]} applies to --engine {owner} only")
        raise UsageError(
            f'{how[name]} applies to engine = "{owner}" only '
            f"(the scenario or --engine says {cls.engine})"
        )


def parse_run_options(flags: Mapping[str, Any], scenario: Scenario | None = None) -> RunOptions:
    """The command line (`flags`: the run command's parameters, None where not given) over the
    scenario file -> the chosen engine's options, every check done. Faults: the scenario's,
    then the command line's (both apply)."""
    from_file, from_flags = scenario_values(scenario), _flag_values(flags)
    engine = from_flags.pop("engine", None) or from_file.pop("engine", None) or DEFAULT_ENGINE
    from_file.pop("engine", None)
    cls = ENGINE_OPTIONS.get(str(engine))
    if cls is None:
        raise UsageError(f"unknown --engine {engine!r}; valid: {', '.join(ENGINE_OPTIONS)}")
    how = {n: f"scenario key {n!r}" for n in from_file}
    how.update({n: "--" + n.replace("_", "-") for n in from_flags})
    how["faults"] = "--fault"
    _refuse_foreign(cls, [*from_file, *from_flags], how)
    values = {**from_file, **from_flags}
    if "faults" in from_file and "faults" in from_flags:
        values["faults"] = from_file["faults"] + from_flags["faults"]
    given = {n: h for n, h in how.items() if n in values}
    return cls(**values, given=given)


# How a bisect axis marks the option it sets (`given`): the user typed it on bisect's line.
AXIS_HOW = "bisect axis"


def from_command_line(options: RunOptions, name: str) -> bool:
    """Whether the user's command line (a run flag or a bisect axis), not the scenario, set
    option `name`."""
    return options.given.get(name, "").startswith(("--", AXIS_HOW))
