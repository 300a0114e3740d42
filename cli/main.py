"""Entry point: the Typer app, one sub-command per module, and the single error -> exit policy."""

from __future__ import annotations

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
from hicache_diag.verdict import ExitCode

app = typer.Typer(
    name="hicache-diag",
    help="Diagnose and reproduce rank divergence in SGLang pipeline parallelism with HiCache.",
    pretty_exceptions_enable=False,
    # Plain click help: it wraps option names and help at any width instead of truncating
    # them, never reads `[...]` in help text as markup, and shows no type column.
    rich_markup_mode=None,
    no_args_is_help=True,
    add_completion=False,
)

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


def _register() -> None:
    # Imported here so that `--help` lists every command and each module stays self-contained.
    from hicache_diag.cli import bisect, report, run, sources, timeline, triage

    for module in (run, triage, bisect, report, timeline, sources):
        module.register(app)
    bisect.add_run_flags_to_help(app)


_register()


def _fail(message: str, code: ExitCode) -> int:
    sys.stderr.write(f"hicache-diag: error: {message}\n")
    return int(code)


def run_cli(argv: list[str] | None = None) -> int:
    """Run the app and map every way it can end to an exit code (httpie's single mapping point)."""
    try:
        rv = app(args=argv, prog_name="hicache-diag", standalone_mode=False)
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
    sys.exit(run_cli(sys.argv[1:]))


if __name__ == "__main__":
    main()
