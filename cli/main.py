"""Entry point: the Typer app, one sub-command per module, and the single error -> exit policy."""

from __future__ import annotations

import json
import os
import signal
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

_state = {"verbose": False}


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
    from hicache_diag.cli.render.console import TERMINAL_WARNINGS
    from hicache_diag.options.env_vars import check_environment, environment_warnings

    check_environment()  # a variable the tool cannot use: one line, exit 2, before any work
    for warning in [*environment_warnings(), *TERMINAL_WARNINGS]:
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


def _fail(message: str, code: ExitCode | int) -> int:
    from hicache_diag.cli.render.console import escape_controls

    message = escape_controls(message)  # a file name or a log line must not drive the terminal
    sys.stderr.write(f"hicache-diag: error: {message}\n")
    _json_error(message, int(code))
    return int(code)


_json = {"asked": False, "stdout": None}


def _json_error(message: str, code: int) -> None:
    """With --json, stdout is one JSON document on every exit: a refusal, an interrupt or an
    error that left it empty gets `{"schema", "error", "exit_code"}` (docs/design.md)."""
    out = _json["stdout"]
    if _json["asked"] and out is not None and not out.written:
        doc = {"schema": ERROR_SCHEMA, "error": message, "exit_code": code}
        out.write(json.dumps(doc) + "\n")
        out.flush()


class _Counting:
    """stdout, counting what the command wrote (so an error adds a JSON document only where
    there is none yet)."""

    def __init__(self, stream) -> None:
        self._stream, self.written = stream, 0

    def write(self, text: str) -> int:
        self.written += len(text)
        return self._stream.write(text)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _asks_json(argv: list[str]) -> bool:
    """--json on the command line as a flag (not the value of an option, not after `--`)."""
    group = typer.main.get_command(app)
    commands = getattr(group, "commands", {})
    sub = next((a for a in argv if not a.startswith("-")), None)
    takes = _value_options(commands.get(sub)) | _value_options(commands.get("run"))
    skip = False
    for arg in argv:
        if arg == "--":
            return False
        if not skip and arg == "--json":
            return True
        skip = not skip and arg in takes
    return False


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
    """Run the app and map every way it can end to an exit code (httpie's single mapping point).
    With --json, stdout is one JSON document whatever the exit code (`_json_error`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        return _print_help()  # a bare command: the help, not its last line as an error
    argv = _hoist_verbose(argv)
    stdout = sys.stdout
    _json.update(asked=_asks_json(argv), stdout=_Counting(stdout))
    sys.stdout = _json["stdout"]
    try:
        return _run(argv)
    finally:
        from hicache_diag.evidence.claims import release_all

        sys.stdout = stdout
        _json.update(asked=False, stdout=None)
        release_all()  # the outputs this command claimed (evidence/claims.py)


def _run(argv: list[str]) -> int:
    from hicache_diag.cli import phase
    from hicache_diag.trials.signals import STOP_SIGNALS, restore_sigterm, trap_sigterm

    old = trap_sigterm()  # SIGTERM / SIGHUP at any point end the command as a Ctrl-C would
    try:
        return _run_command(argv)
    finally:
        if old:  # the command has ended: a late stop signal changes nothing
            for sig in STOP_SIGNALS:
                signal.signal(sig, _late_stop)
        phase["now"] = "ended"
        restore_sigterm(old)


def _late_stop(signum: int, frame: object) -> None:
    """A stop signal as the command ends: its outputs are written, nothing is left to stop."""


def _run_command(argv: list[str]) -> int:
    from hicache_diag.cli.repeated import refuse_repeated
    from hicache_diag.trials.signals import StopSignal

    try:
        group = typer.main.get_command(app)
        refuse_repeated(group, argv)
        rv = group.main(args=argv, prog_name="hicache-diag", standalone_mode=False)
    except Exit as exc:
        return _ended(int(exc.exit_code))
    except ClickUsageError as exc:
        lines = exc.format_message().strip().splitlines()
        if not lines:  # no arguments at all: help was printed (NoArgsIsHelpError)
            return int(ExitCode.BAD_INPUT)
        return _fail(lines[-1], ExitCode.BAD_INPUT)
    except StopSignal as exc:  # SIGTERM / SIGHUP outside a run's own handling
        sys.stderr.write(f"hicache-diag: interrupted by {exc.name}\n")
        _json_error(f"interrupted by {exc.name}", 130)
        return 130
    except (Abort, KeyboardInterrupt):
        sys.stderr.write("hicache-diag: interrupted\n")
        _json_error("interrupted", 130)
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
    return _ended(int(rv or 0))


def _ended(code: int) -> int:
    """A command's own exit (click returns typer.Exit's code): one that said why on stderr and
    printed no result gets its JSON document too."""
    if code:
        _json_error("interrupted" if code == 130 else f"no result (exit {code})", code)
    return code


def main() -> None:
    from hicache_diag.trials.signals import STOP_SIGNALS

    if not isinstance(sys.stdout, _PipeSafe):
        sys.stdout = _PipeSafe(sys.stdout)
    code = run_cli(sys.argv[1:])
    for sig in STOP_SIGNALS:  # ignored, not handled: the interpreter's teardown resets a
        signal.signal(sig, signal.SIG_IGN)  # handler to the default (death), never SIG_IGN
    sys.exit(code)


if __name__ == "__main__":
    main()
