"""Entry point: the Typer app, one sub-command per module, and the single error -> exit policy."""

from __future__ import annotations

import json
import os
import sys
import traceback

import typer

try:  # typer >= 0.24 vendors click
    from typer._click.exceptions import UsageError as ClickUsageError
    from typer.exceptions import Abort, Exit
except ImportError:  # pragma: no cover - older typer on top of click
    from click.exceptions import Abort, Exit
    from click.exceptions import UsageError as ClickUsageError

from hicache_diag import __version__
from hicache_diag.errors import HicacheDiagError, UsageError
from hicache_diag.evidence.verdict import ExitCode

app = typer.Typer(
    name="hicache-diag",
    help="Diagnose and reproduce rank divergence in SGLang pipeline parallelism with HiCache.",
    pretty_exceptions_enable=False,
    # Plain click help: it wraps option names and help at any width instead of truncating
    # them, never reads `[...]` in help text as markup, and shows no type column.
    rich_markup_mode=None,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
VERBOSE_FLAGS = ("-v", "--verbose")

_state = {"verbose": False, "json": False}


def _version(value: bool) -> None:
    if value:
        typer.echo(f"hicache-diag {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show tracebacks of errors."),
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    _state["verbose"] = verbose
    from hicache_diag.options.env_vars import check_environment, environment_warnings

    check_environment()  # a variable the tool cannot use: one line, exit 2, before any work
    for warning in environment_warnings():
        _warn(warning)


def _warn(message: str) -> None:
    sys.stderr.write(f"hicache-diag: warning: {message}\n")


def _register() -> None:
    # Imported here so that `--help` lists every command and each module stays self-contained.
    from hicache_diag.cli import (
        bisect,
        export,
        hunt,
        record,
        report,
        run,
        shrink,
        sources,
        timeline,
        triage,
    )

    for module in (run, record, triage, bisect, report, timeline, sources, export, hunt, shrink):
        module.register(app)
    bisect.add_run_flags_to_help(app)


_register()


ERROR_SCHEMA = "hicache-diag/error/v1"


def _fail(message: str, code: ExitCode) -> int:
    """The one line on stderr; under --json also one JSON object on stdout, so a script that
    reads stdout gets an answer for every way a command ends."""
    sys.stderr.write(f"hicache-diag: error: {message}\n")
    if _state["json"]:
        doc = {"schema": ERROR_SCHEMA, "error": message, "exit_code": int(code)}
        sys.stdout.write(json.dumps(doc) + "\n")
    return int(code)


def _value_options(command) -> set[str]:
    """Option names of `command` that take a value (the token after them is not a flag)."""
    names = set()
    for param in getattr(command, "params", []):
        if not getattr(param, "is_flag", False) and getattr(param, "opts", None):
            names |= {o for o in param.opts if o.startswith("-")}
    return names


def _hoist_verbose(argv: list[str]) -> list[str]:
    """`-v` anywhere (errors say "rerun with -v", wherever the user typed it): moved before the
    sub-command, unless it is the value of an option (`--sglang-arg -v`) or follows `--`."""
    group = typer.main.get_command(app)
    commands = getattr(group, "commands", {})
    sub = next((a for a in argv if not a.startswith("-")), None)
    takes = _value_options(commands.get(sub)) | _value_options(commands.get("run"))
    out, verbose, skip, literal = [], False, False, False
    for arg in argv:
        if skip or literal:
            out.append(arg)
            skip = False
            continue
        if arg == "--":
            literal = True
        elif arg in VERBOSE_FLAGS:
            verbose = True
            continue
        skip = arg in takes
        out.append(arg)
    return ["-v", *out] if verbose else out


def _print_help() -> int:
    group = typer.main.get_command(app)
    with group.make_context("hicache-diag", [], resilient_parsing=True) as ctx:
        sys.stdout.write(group.get_help(ctx) + "\n")
    return int(ExitCode.OK)


class _PipeSafe:
    """stdout that survives a closed reader (`| head`): the rest is dropped, and the command
    still ends with its own exit code instead of a BrokenPipeError (exit 1)."""

    def __init__(self, stream) -> None:
        self._stream, self.closed_by_reader = stream, False

    def write(self, text: str) -> int:
        if not self.closed_by_reader:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._closed()
        return len(text)

    def flush(self) -> None:
        if not self.closed_by_reader:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._closed()

    def _closed(self) -> None:
        self.closed_by_reader = True
        try:  # the interpreter flushes fd 1 at exit; point it at /dev/null so that cannot fail
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
        except (OSError, ValueError):
            pass

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def run_cli(argv: list[str] | None = None) -> int:
    """Run the app and map every way it can end to an exit code (httpie's single mapping point)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        return _print_help()  # a bare command: the help, not its last line as an error
    argv = _hoist_verbose(argv)
    _state["json"] = "--json" in argv[: argv.index("--")] if "--" in argv else "--json" in argv
    try:
        rv = typer.main.get_command(app).main(
            args=argv, prog_name="hicache-diag", standalone_mode=False
        )
    except Exit as exc:
        return int(exc.exit_code)
    except ClickUsageError as exc:
        lines = exc.format_message().strip().splitlines()
        if not lines:  # no arguments at all: help was printed (NoArgsIsHelpError)
            return int(ExitCode.BAD_INPUT)
        return _fail(lines[-1], ExitCode.BAD_INPUT)
    except (Abort, KeyboardInterrupt):
        sys.stderr.write("hicache-diag: interrupted\n")
        return 130
    except UsageError as exc:
        return _fail(str(exc), ExitCode.BAD_INPUT)
    except HicacheDiagError as exc:
        return _fail(str(exc), ExitCode.INTERNAL_ERROR)
    except Exception as exc:  # noqa: BLE001 - the one place that turns bugs into exit 1
        if _state["verbose"]:
            traceback.print_exc()
        hint = "" if _state["verbose"] else " (rerun with -v for the traceback)"
        return _fail(f"internal error: {type(exc).__name__}: {exc}{hint}", ExitCode.INTERNAL_ERROR)
    return int(rv or 0)


def main() -> None:
    if not isinstance(sys.stdout, _PipeSafe):
        sys.stdout = _PipeSafe(sys.stdout)
    sys.exit(run_cli(sys.argv[1:]))


if __name__ == "__main__":
    main()
