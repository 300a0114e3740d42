"""Options declared once (options/params.py `Param`) made into typer options, read back by the
same objects, and each command's input checks: one table per command (`Check` rows), run
before the command does anything, every row naming the options it reads by their `Param`.

A rename of a flag is one edit: the typer option, the check that reads it and the message that
names it all come from the one `Param`."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import typer
from typer.core import TyperCommand

from hicache_diag.errors import UsageError
from hicache_diag.options.params import Param


def with_default(help: str, value: object) -> str:
    """`help  [default: X]`, exactly as click prints a real default, for options whose own
    default is None (so that a scenario can fill them in) and for descriptive defaults."""
    return f"{help}  [default: {value}]"


def typer_option(
    param: Param, *, default_text: object = None, hidden: bool = False, panel: str | None = None
) -> Any:
    """The typer option of `param` (its flag and visible aliases); `default_text`: shown as
    `[default: X]` (None: no default is shown); `panel`: its --help panel, if not its own."""
    text = param.help if default_text is None else with_default(param.help, default_text)
    return typer.Option(
        param.flag,
        *param.aliases,
        metavar=param.metavar,
        help=text,
        show_default=False,
        hidden=hidden,
        rich_help_panel=panel or param.panel,
    )


def flag(param: Param, kind: Any, default_text: object = None) -> Any:
    """`Annotated[kind, <param's typer option>]`: a command's parameter made from `param`."""
    return Annotated[kind, typer_option(param, default_text=default_text)]


def warn(message: str) -> None:
    sys.stderr.write(f"hicache-diag: warning: {message}\n")


def _source(ctx: Any, name: str) -> str:
    return getattr(ctx.get_parameter_source(name), "name", "")


@dataclass(frozen=True, slots=True)
class Parsed:
    """A command's parameters as click parsed them, read by their `Param`: the click parameter
    is the one whose spellings hold the Param's flag (and, for its old spellings, the hidden
    one that holds them)."""

    ctx: Any

    def _names(self, param: Param) -> list[str]:
        params = self.ctx.command.params
        names = [p.name for p in params if param.flag in getattr(p, "opts", ())]
        if not names:
            raise KeyError(f"{self.ctx.command.name} has no option {param.flag}")
        old = set(param.deprecated)
        return names + [p.name for p in params if old & set(getattr(p, "opts", ()))]

    def _name(self, param: Param) -> str:
        return self._names(param)[0]

    def value(self, param: Param) -> Any:
        """The value the command line gave it (under any spelling), else its default."""
        names = self._names(param)
        given = [n for n in names if _source(self.ctx, n) == "COMMANDLINE"]
        return self.ctx.params.get((given or names)[0])

    def argument(self, name: str) -> Any:
        """A positional argument's value (an argument has no flag to name it by)."""
        return self.ctx.params.get(name)

    def given(self, *params: Param) -> bool:
        """Whether the command line set any of `params` (under any spelling)."""
        names = [n for p in params for n in self._names(p)]
        return any(_source(self.ctx, n) == "COMMANDLINE" for n in names)

    def given_flags(self) -> list[str]:
        """Every option the command line set, by its flag, sorted."""
        return sorted(
            p.opts[0]
            for p in self.ctx.command.params
            if getattr(p, "opts", None) and _source(self.ctx, p.name) == "COMMANDLINE"
        )


@dataclass(frozen=True, slots=True)
class Check:
    """One input rule of a command: `reason(parsed)` is the one line that refuses (exit 2),
    or None; a `warn` row only warns (the input has a smaller effect than it says, not none)."""

    name: str
    reason: Callable[[Parsed], str | None]
    warn: bool = False


def check(ctx: Any, table: Iterable[Check]) -> Parsed:
    """Run a command's table over its parsed parameters: the first refusing row raises
    UsageError (exit 2); warning rows print one line each. Returns the parsed view."""
    parsed = Parsed(ctx)
    for row in table:
        why = row.reason(parsed)
        if why and not row.warn:
            raise UsageError(why)
        if why:
            warn(why)
    return parsed


class PanelCommand(TyperCommand):
    """Plain click help (wraps at any width, no markup) with the options grouped in panels,
    by each option's `rich_help_panel`, in the order `panels` lists (then any other). An
    engine's panel (`engine_panels`: panel -> engine) is left out when the command line names
    another engine (`run --engine sglang --help` shows SGLang's options, not the builtin's)."""

    panels: Sequence[str] = ()
    engine_panels: dict[str, str] = {}

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        ctx.meta["argv"] = list(args)  # for --help, which fires before --engine is read
        return super().parse_args(ctx, args)

    def _named_engine(self, ctx: Any) -> str | None:
        argv = ctx.meta.get("argv", [])
        for i, arg in enumerate(argv):
            if arg == "--engine" and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith("--engine="):
                return arg.split("=", 1)[1]
        return None

    def format_options(self, ctx: Any, formatter: Any) -> None:
        chosen = self._named_engine(ctx)
        groups: dict[str, list[tuple[str, str]]] = {name: [] for name in self.panels}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            panel = getattr(param, "rich_help_panel", None) or "Options"
            owner = self.engine_panels.get(panel)
            if record is None or (chosen and owner and owner != chosen):
                continue
            groups.setdefault(panel, []).append(record)
        for panel, rows in groups.items():
            if rows:
                with formatter.section(panel):
                    formatter.write_dl(rows)
