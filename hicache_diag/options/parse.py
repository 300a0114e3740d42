"""The one parser of run options: the command line over a scenario file -> the engine's
`RunOptions`. The engines' option classes come from the registry (engines/registry.py
`run_options`), the command line's values from the CLI's flags, which are made from the same
fields (cli/run_flags.py); a bad key, type or flag is one line naming what the user wrote
(exit 2)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from hicache_diag.errors import UsageError
from hicache_diag.options.no_effect import refuse_no_effect
from hicache_diag.options.run_options import ENV_NAME, RunOptions, field_names, flag_of

if TYPE_CHECKING:
    from hicache_diag.faults import Scenario

# The engines' option classes by registry name, the default engine first.
OptionClasses = Mapping[str, type[RunOptions]]

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


@dataclass(frozen=True, slots=True)
class CommandLine:
    """What a command line gave: values by field (only those given), how each was written
    (its flag), and the engine it named."""

    values: Mapping[str, Any] = field(default_factory=dict)
    how: Mapping[str, str] = field(default_factory=dict)
    engine: str | None = None


def scenario_keys(classes: OptionClasses) -> dict[str, tuple[str, tuple[type, ...]]]:
    """Each scenario key -> (the field it sets, the type it must have), from every engine's
    fields: a field's own name, or its `scenario_key`, and each other spelling of its flag."""
    keys: dict[str, tuple[str, tuple[type, ...]]] = {}
    for cls in classes.values():
        for f in fields(cls):
            if f.name == "given" or not f.metadata.get("scenario", False):
                continue
            kind = f.metadata.get("scenario_kind") or _KINDS.get(str(f.type), _LIST)
            keys[f.metadata.get("scenario_key", f.name)] = (f.name, kind)
            param = f.metadata.get("param")
            for alias in param.aliases if param else ():
                keys[alias.removeprefix("--").replace("-", "_")] = (f.name, kind)
    return keys


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


def scenario_values(scenario: Scenario | None, classes: OptionClasses) -> dict[str, Any]:
    """A scenario's run options by field name, typed as the fields are; its faults first."""
    if scenario is None:
        return {}
    keys, path = scenario_keys(classes), str(scenario.path)
    out: dict[str, Any] = {}
    for key, value in scenario.options.items():
        if key == "engine":
            _check_type(path, key, value, _STR)
            out["engine"] = value
            continue
        if key not in keys:
            valid = ", ".join(sorted({*keys, "engine", "description", "fault"}))
            raise UsageError(f"scenario {path!r}: unknown key {key!r}; valid keys: {valid}")
        name, want = keys[key]
        _check_type(path, key, value, want)
        out.setdefault(name, _field_value(key, value, path, want))
    if scenario.faults:
        out["faults"] = scenario.fault_specs()
    return out


def _field_value(key: str, value: Any, path: str, want: tuple[type, ...]) -> Any:
    if isinstance(value, dict):  # an environment table: NAME = "VALUE"
        bad = next((n for n in value if not ENV_NAME.fullmatch(str(n))), None)
        if bad is not None:
            raise UsageError(f"scenario {path!r}: {key}: {bad!r} is not a variable name")
        return tuple(f"{n}={v}" for n, v in value.items())
    if isinstance(value, list):
        return tuple(value)
    return str(value) if str in want and int in want else value  # a size: "64MiB" or bytes


def _owner(name: str, classes: OptionClasses) -> str:
    owner = next((e for e, cls in classes.items() if name in field_names(cls)), None)
    if owner is None:
        raise ValueError(f"{name!r} is no engine's run option")
    return owner


def _refuse_foreign(
    cls: type[RunOptions], names: Iterable[str], how: Mapping[str, str], classes: OptionClasses
) -> None:
    own = set(field_names(cls))
    for name in names:
        if name in own:
            continue
        why = getattr(cls, "foreign", {}).get(name)
        if why:
            raise UsageError(why.format(how=how[name]))
        owner = _owner(name, classes)
        if how[name].startswith("--"):
            raise UsageError(f"{how[name]} applies to --engine {owner} only")
        raise UsageError(
            f'{how[name]} applies to engine = "{owner}" only '
            f"(the scenario or --engine says {cls.engine})"
        )


def parse_run_options(
    line: CommandLine, scenario: Scenario | None, classes: OptionClasses
) -> RunOptions:
    """The command line over the scenario file -> the chosen engine's options, every check
    done. Faults: the scenario's, then the command line's (both apply)."""
    from_file = scenario_values(scenario, classes)
    engine = line.engine or from_file.pop("engine", None) or next(iter(classes))
    from_file.pop("engine", None)
    cls = classes.get(str(engine))
    if cls is None:
        raise UsageError(f"unknown --engine {engine!r}; valid: {', '.join(classes)}")
    from_flags = dict(line.values)
    how = {n: f"scenario key {n!r}" for n in from_file}
    how.update({n: line.how.get(n) or flag_of(classes[_owner(n, classes)], n) for n in from_flags})
    _refuse_foreign(cls, [*from_file, *from_flags], how, classes)
    values = {**from_file, **from_flags}
    if "faults" in from_file and "faults" in from_flags:
        values["faults"] = from_file["faults"] + from_flags["faults"]
    given = {n: h for n, h in how.items() if n in values}
    return refuse_no_effect(cls(**values, given=given))


# How a bisect axis marks the option it sets (`given`): the user typed it on bisect's line.
AXIS_HOW = "bisect axis"


def from_command_line(options: RunOptions, name: str) -> bool:
    """Whether the user's command line (a run flag or a bisect axis), not the scenario, set
    option `name`."""
    return options.given.get(name, "").startswith(("--", AXIS_HOW))
