"""The hicache-diag command line (installed as hicache_diag.cli): typer + rich, no runtime logic.

As the program (the `hicache-diag` script, `python -m hicache_diag.cli.main`), a stop signal
(SIGINT, SIGTERM, SIGHUP) is handled from the first line on: while the command's modules load,
nothing has started or been written, so it ends at once with exit 130 and one line (a JSON
document too under --json), never a traceback from an import; once the command has ended, one
changes nothing; in between, the command's own trap handles it (cli/main.py `_run`)."""

import os as _os
import signal as _signal
import sys as _sys

STOP_SIGNALS = (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP)
phase = {"now": "starting"}  # starting -> (the command's own trap) -> ended


def _stopped(signum: int, frame: object) -> None:
    if phase["now"] == "ended":
        return  # the command's outputs are written and its result printed: nothing to stop
    name = _signal.Signals(signum).name
    _os.write(2, f"hicache-diag: interrupted by {name} before the command started\n".encode())
    if "--json" in _sys.argv[1:]:
        _os.write(1, b'{"error": "interrupted by %s", "exit_code": 130}\n' % name.encode())
    _os._exit(130)  # nothing started, nothing written: no cleanup to run


def _the_program() -> bool:
    head = _os.path.basename(_sys.argv[0]) if _sys.argv else ""
    return head == "hicache-diag" or (head == "-m" and "hicache_diag.cli.main" in _sys.orig_argv)


if _the_program():
    for _sig in STOP_SIGNALS:
        _signal.signal(_sig, _stopped)
