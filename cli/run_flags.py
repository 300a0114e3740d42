"""The `run` flags, made from the run options' own fields (each field's `Param`: its flag, help
and panel; its type and default), every engine's: one declaration per option, shared by `run`,
bisect's pass-through flags, hunt and shrink. What a command line gave is read back into a
typed `CommandLine` (values by field, how each was written), never matched by name."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import Field
from functools import cache
from typing import Annotated, Any

import typer

from hicache_diag.cli.params import PanelCommand, Parsed, typer_option, warn
from hicache_diag.engines.registry import DEFAULT_ENGINE, ENGINES, default_help, option_classes
from hicache_diag.options.params import COMMON, PANELS, Param, params
from hicache_diag.options.parse import CommandLine
from hicache_diag.options.run_options import RunOptions

ENGINE = Param(
    "--engine",
    " or ".join(f"{name} ({cls.summary})" for name, cls in option_classes().items()) + ".",
    "NAME",
    COMMON,
)
SCENARIO = Param("--scenario", "TOML scenario: fault tables and run options.", "FILE", COMMON)

# A field's type -> the command line's (None: not given, so a scenario can fill it in).
_KINDS: dict[str, Any] = {
    "int": int | None,
    "int | None": int | None,
    "float": float | None,
    "str": str | None,
    "str | None": str | None,
    "bool": bool,
    "tuple[str, ...]": list[str] | None,
}


def engine_panel(cls: type[RunOptions]) -> str:
    return f"{cls.engine} engine: {cls.summary} ({ENGINE} {cls.engine})"


@cache
def run_fields() -> tuple[tuple[Field, Param, str], ...]:
    """Every engine's run-option fields that have a flag, once each (the common ones first),
    with the --help panel each goes in."""
    seen: dict[str, tuple[Field, Param, str]] = {}
    for cls in (RunOptions, *option_classes().values()):
        for f, param in params(cls):
            seen.setdefault(f.name, (f, param, param.panel or engine_panel(cls)))
    return tuple(seen.values())


def _parameter(name: str, annotation: Any, default: Any) -> inspect.Parameter:
    kind = inspect.Parameter.KEYWORD_ONLY
    return inspect.Parameter(name, kind, default=default, annotation=annotation)


def _field_parameters() -> list[inspect.Parameter]:
    out = []
    for f, param, panel in run_fields():
        kind = _KINDS[str(f.type)]
        shown = None if kind in (bool, list[str] | None) else param.default_text
        if kind not in (bool, list[str] | None) and shown is None and f.default is not None:
            shown = default_help(f.name)
        option = typer_option(param, default_text=shown, panel=panel)
        out.append(_parameter(f.name, Annotated[kind, option], False if kind is bool else None))
        for i, old in enumerate(param.deprecated):  # old spellings: hidden, still read
            hidden = typer.Option(old, hidden=True, show_default=False)
            out.append(_parameter(f"{f.name}__old{i}", Annotated[kind, hidden], None))
    return out


def with_run_flags(command: Callable[..., Any]) -> Callable[..., Any]:
    """`command` with every run flag after its own parameters, for typer to read; the values
    reach it through `command_line(ctx)`, not as arguments."""
    own = list(inspect.signature(command, eval_str=True).parameters.values())
    names = {p.name for p in own}

    def call(**kwargs: Any) -> Any:
        return command(**{k: v for k, v in kwargs.items() if k in names})

    call.__signature__ = inspect.Signature(own + _field_parameters())  # type: ignore[attr-defined]
    call.__name__, call.__doc__ = command.__name__, command.__doc__
    call.__annotations__ = {}
    return call


def command_line(ctx: Any) -> CommandLine:
    """What the command line gave of the run flags: values by field, each as its flag spells
    it; an old spelling warns once, naming the flag to use."""
    parsed = Parsed(ctx)
    values, how = {}, {}
    for f, param, _ in run_fields():
        value = _given(ctx, f.name)
        for i, old in enumerate(param.deprecated):
            was = _given(ctx, f"{f.name}__old{i}")
            if was is not None:
                warn(f"{old} is deprecated: use {param.flag}")
                value = was if value is None else _joined(value, was)
        if value is not None:
            values[f.name] = tuple(value) if isinstance(value, list | tuple) else value
            how[f.name] = param.flag
    engine = parsed.value(ENGINE) if parsed.given(ENGINE) else None
    return CommandLine(values, how, engine)


def _given(ctx: Any, name: str) -> Any:
    source = getattr(ctx.get_parameter_source(name), "name", "")
    return ctx.params.get(name) if source == "COMMANDLINE" else None


def _joined(a: Any, b: Any) -> Any:
    return (*a, *b) if isinstance(a, list | tuple) else a


def pass_through_names() -> dict[str, str]:
    """Each run flag a bisect axis may vary, by its name (`--NAME` without dashes, aliases
    too) -> the field it sets."""
    names = {}
    for f, param, _ in run_fields():
        if f.name in ("out", "seed", "check"):
            continue
        for spelling in (param.flag, *param.aliases):
            names[spelling.removeprefix("--")] = f.name
    return names


def configure(command: type[PanelCommand]) -> type[PanelCommand]:
    """`command` with run's panels in order (each engine's after the common ones)."""
    engines = {engine_panel(engine_class(n)): n for n in ENGINES}
    command.panels = (*PANELS[:-1], *engines, PANELS[-1])
    command.engine_panels = engines
    return command


def engine_class(name: str) -> type[RunOptions]:
    return option_classes()[name]


__all__ = ["DEFAULT_ENGINE", "ENGINE", "SCENARIO", "command_line", "with_run_flags"]
