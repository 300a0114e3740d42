"""Start a child as a fork of this interpreter that behaves like `python -m MODULE ARGS` (ours).

Why: a rank started with `python -m` pays the interpreter start and the torch import (1-3 s on
a busy 2-core box) before it can join gloo; a fork of the launcher, which has torch imported
already, pays neither. The child is first reset to what a fresh interpreter would see: its own
argv and environment, stdio on the rank's log, the parent's Python signal handlers and atexit
hooks dropped, the sitecustomize start-up hook run again (hooks that start threads at start-up
would otherwise be missing: threads do not survive a fork). Then runpy runs MODULE as __main__,
and the child always ends in os._exit, so it never unwinds into the parent's stack (its finally
blocks, typer, pytest).

What differs from a spawned child: the child's main thread keeps the parent's frames beneath
runpy (py-spy shows typer and run_trial under the rank's entry; triage's merged tree folds them
into the common prefix), and modules the parent imported stay imported.

Fork hygiene (the caller's part): fork before this process runs a multi-threaded torch op or
starts a native server (a TCPStore master): only the forking thread exists in the child, and a
lock another thread held at the fork stays held there forever.
"""

from __future__ import annotations

import atexit
import faulthandler
import importlib
import io
import os
import runpy
import signal
import sys
import traceback
from collections.abc import Iterable
from typing import NoReturn

# The parent's stream objects, kept alive in the child: finalising one would flush the parent's
# buffered bytes into the rank's log.
_PARENT_STREAMS: list[object] = []


class ForkedProcess:
    """The part of subprocess.Popen the launcher uses: pid, poll(), wait(), kill(), returncode
    (negative signal number when a signal ended the child, as Popen reports it)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self._reap(os.WNOHANG)
        return self.returncode

    def wait(self) -> int:
        while self.returncode is None:
            self._reap(0)
        return self.returncode

    def kill(self) -> None:
        # Never signal a reaped pid: the kernel may have handed it to another process.
        if self.returncode is None:
            os.kill(self.pid, signal.SIGKILL)

    def _reap(self, flags: int) -> None:
        try:
            pid, status = os.waitpid(self.pid, flags)
        except ChildProcessError:  # reaped elsewhere (SIGCHLD ignored): Popen reports 0 too
            self.returncode = 0
            return
        if pid == self.pid:
            self.returncode = os.waitstatus_to_exitcode(status)


def preload(modules: Iterable[str]) -> list[str]:
    """Import `modules` here, so that forked children find them in sys.modules; return the ones
    that do not exist (a speed-up only: the child imports what it needs anyway). Imports only:
    nothing here may run a torch op or start a thread."""
    missing = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError:
            missing.append(name)
    return missing


def fork_module(
    module: str, args: list[str], log_fd: int, env: dict[str, str], close_fds: Iterable[int] = ()
) -> ForkedProcess:
    """Fork a child that runs `module` as __main__ with sys.argv[1:] = `args`, stdin on
    /dev/null and stdout + stderr on `log_fd`, with `env` added to its environment. The child
    closes `close_fds` (raw fds of the parent that are not its business, e.g. other pipes)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()  # else the child's copy of the buffer could be written twice
        except (AttributeError, OSError, ValueError):
            pass
    from hicache_diag.trials.signals import STOP_SIGNALS
    from hicache_diag.trials.trial_guard import signals_deferred

    # A stop signal handled inside fork's after-fork hooks would be "ignored" and lost: held,
    # and delivered once the child exists; the child starts from the handlers as they were.
    before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    with signals_deferred():
        pid = os.fork()
        if pid == 0:
            for sig, handler in before.items():
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
            _child_main(module, args, log_fd, env, tuple(close_fds))
    return ForkedProcess(pid)


def _child_main(
    module: str, args: list[str], log_fd: int, env: dict[str, str], close_fds: tuple[int, ...]
) -> NoReturn:
    code = 1
    try:
        for fd in close_fds:
            os.close(fd)
        _redirect_stdio(log_fd)
        _become_fresh(module, args, env)
        code = _run_module(module)
    except BaseException:  # noqa: BLE001 - whatever happens, the child must not return
        _print_exc()
    finally:
        _flush_and_exit(code)


def _redirect_stdio(log_fd: int) -> None:
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    _PARENT_STREAMS.extend((sys.stdin, sys.stdout, sys.stderr))
    # As PYTHONUNBUFFERED does for a spawned rank: every line reaches the log at once.
    sys.stdin = sys.__stdin__ = open(0, closefd=False)  # noqa: SIM115
    sys.stdout = sys.__stdout__ = _text_stream(1, "strict")
    sys.stderr = sys.__stderr__ = _text_stream(2, "backslashreplace")


def _text_stream(fd: int, errors: str) -> io.TextIOWrapper:
    raw = io.FileIO(fd, "w", closefd=False)
    return io.TextIOWrapper(raw, encoding="utf-8", errors=errors, write_through=True)


def _become_fresh(module: str, args: list[str], env: dict[str, str]) -> None:
    os.environ.update(env)
    sys.argv = [module, *args]  # runpy replaces argv[0] with the module's file, as -m does
    atexit._clear()  # the parent's hooks (temp dirs, loggers) are not the child's to run
    _reset_signals()
    _reset_faulthandler()
    _rerun_site_hooks()


def _reset_signals() -> None:
    """Drop the parent's Python-level handlers (exec would reset them too); SIG_IGN survives
    exec, so it survives here as well."""
    signal.set_wakeup_fd(-1)
    for sig in signal.valid_signals():
        try:
            handler = signal.getsignal(sig)
            if callable(handler) and handler is not signal.default_int_handler:
                signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            pass


def _reset_faulthandler() -> None:
    # The parent's faulthandler writes to the parent's files (pytest's dup of stderr).
    faulthandler.cancel_dump_traceback_later()
    for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        faulthandler.unregister(sig)
    if faulthandler.is_enabled():
        faulthandler.enable(file=sys.stderr, all_threads=True)


def _rerun_site_hooks() -> None:
    for name in ("sitecustomize", "usercustomize"):
        mod = sys.modules.get(name)
        if mod is None:
            continue
        try:
            importlib.reload(mod)
        except Exception as exc:  # noqa: BLE001 - site.py reports and goes on, so do we
            print(f"Error in {name}; set PYTHONVERBOSE for traceback:", file=sys.stderr)
            print(f"{type(exc).__name__}: {exc}", file=sys.stderr)


def _run_module(module: str) -> int:
    """Run `module` as __main__; the exit code the interpreter would give, atexit included."""
    sys.modules.pop(module, None)  # `python -m` never finds its module imported already
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except BaseException:  # noqa: BLE001 - an uncaught exception: traceback, exit 1
        _print_exc()
        code = 1
    atexit._run_exitfuncs()
    return code


def _exit_code(value: object) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)  # sys.exit("message"), as the interpreter prints it
    return 1


def _print_exc() -> None:
    try:
        traceback.print_exc()
    except BaseException:  # noqa: BLE001, S110 - stderr itself is broken; nothing to tell
        pass


def _flush_and_exit(code: int) -> NoReturn:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001, S110
            pass
    os._exit(code)
