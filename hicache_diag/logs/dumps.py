"""The log reader's handlers for stack dumps inside a log: SGLang's `Pyspy dump for PID N:`
blocks, py-spy's own failures (what they say of the process: stopped, gone, or nothing), and
faulthandler blocks (after `Fatal Python error`, `dump_traceback_later`, SIGUSR1)."""

from __future__ import annotations

import re

from hicache_diag.evidence.ranks import is_component_title
from hicache_diag.evidence.stacks import RankDump, parse_faulthandler, parse_pyspy_text
from hicache_diag.logs.model import (
    LogEvidence,
    LogException,
    LogLine,
    PyspyFailure,
    ReadCtx,
)
from hicache_diag.logs.tracebacks import MAX_BLOCK, TRACEBACK
from hicache_diag.logs.window import LineWindow
from hicache_diag.rules import signatures as sig
from hicache_diag.rules.process_fate import pyspy_fate
from hicache_diag.rules.rank_labels import split_prefix
from hicache_diag.rules.signatures import Context

_PYSPY = re.compile(r"Pyspy dump for PID (\d+)")
_PYSPY_PROCESS = re.compile(r"^Process \d+: ")
_PYSPY_ERROR = re.compile(
    r"Pyspy failed (?:\([^)]{0,300}?--pid (?P<pid>\d+)\)|to dump PID (?P<pid2>\d+))"
)
_FH_START = re.compile(r"^(?:Current thread|Thread) 0x[0-9a-fA-F]+ \(most recent call first\):?")
_FH_BODY = re.compile(
    r'^(?:\s+File "|\s*$|(?:Current thread|Thread) 0x|Extension modules:|  <no Python frame>)'
)
_FH_FRAME_IN = re.compile(r'^File "[^"]{0,1000}", line \d+ in (\S{1,200})')


def is_prefixed(line: str) -> bool:
    return (line[:1] == "[" or line[:1].isdigit()) and split_prefix(line) is not None


def _read_pyspy(
    lines: LineWindow, start: int, source: str, ctx: ReadCtx
) -> tuple[list[RankDump], int]:
    """The py-spy text after `Pyspy dump for PID N:`, up to the next prefixed log line."""
    end = start + 1
    while lines.has(end) and not is_prefixed(lines[end]) and end - start < MAX_BLOCK:
        end += 1
    dumps = parse_pyspy_text(lines.slice(start, end), source)
    for dump in dumps:
        if dump.rank is None:
            dump.rank = ctx.rank
    return dumps, end - 1


def on_pyspy(
    lines: LineWindow, i: int, msg: str, source: str, ctx: ReadCtx, ev: LogEvidence
) -> int | None:
    m = _PYSPY.search(msg)
    if not m and not _PYSPY_PROCESS.match(msg):
        return None
    dumps, end = _read_pyspy(lines, i if not m else i + 1, source, ctx)
    if not dumps and not m:
        return None
    for dump in dumps:
        dump.pid = dump.pid or (int(m.group(1)) if m else None)
        dump.lineno = i + 1
        ev.context = ev.context | _dump_context(dump)
        # SGLang prints `Pyspy dump for PID` from its watchdog, and (0.5.23) from the launcher's
        # teardown after a failure: only a scheduler's dump before any teardown is the watchdog's.
        if m and not ctx.torn_down and not is_component_title(dump.title):
            ev.keep(ev.debug_lines, LogLine(ctx.rank, ctx.ts, source, i + 1, msg.strip()))
        ev.keep(ev.dumps, dump)
    return max(end, i)


def _dump_context(dump: RankDump) -> Context:
    main = dump.main_thread()
    if main is None:
        return Context()
    return sig.frames_context([f.name for f in main.frames], [f.filename for f in main.frames])


def on_pyspy_error(
    lines: LineWindow, i: int, msg: str, source: str, ctx: ReadCtx, ev: LogEvidence
) -> int | None:
    """`Pyspy failed (py-spy dump --pid N). Error: ...` (py-spy's stderr may follow on its own
    lines) and `All pyspy dump attempts failed for PID N.`"""
    err = _PYSPY_ERROR.search(msg)
    final = sig.PYSPY_FAILED.search(msg)
    if not err and not final:
        return None
    end = i
    text = msg
    while lines.has(end + 1) and not is_prefixed(lines[end + 1]) and end - i < 6:
        nxt = lines[end + 1]
        if TRACEBACK in nxt or _PYSPY.search(nxt):
            break
        text += " " + nxt.strip()
        end += 1
    pid_text = (err and (err["pid"] or err["pid2"])) or (final and final["pid"])
    pid = int(pid_text) if pid_text else None
    earlier = [f.reason for f in ev.pyspy_failures if f.pid == pid and f.rank == ctx.rank]
    # py-spy's own words, with those of the earlier attempts on the same pid: a fact about
    # the process (stopped, gone) or about the tool (rules.process_fate).
    fate = pyspy_fate(" ".join([*earlier, text]), gave_up=bool(final))
    line = LogLine(ctx.rank, ctx.ts, source, i + 1, msg.strip())
    ev.pyspy_failures.append(PyspyFailure(ctx.rank, pid, text.strip(), fate, line))
    return end


def on_faulthandler(
    lines: LineWindow, i: int, msg: str, source: str, ctx: ReadCtx, ev: LogEvidence
) -> int | None:
    """faulthandler's blocks inside a log: after `Fatal Python error`, after
    `dump_traceback_later`'s `Timeout (0:05:00)!`, or on SIGUSR1."""
    fatal = sig.FATAL_PYTHON.match(msg.strip())
    timeout = msg.strip().startswith("Timeout (") and sig.is_timeout(msg.strip())
    if not (fatal or timeout or _FH_START.match(msg.strip())):
        return None
    end = i
    while (
        lines.has(end + 1)
        and end - i < MAX_BLOCK
        and (_FH_BODY.match(lines[end + 1]) or _FH_START.match(lines[end + 1].strip()))
    ):
        end += 1
    line = LogLine(ctx.rank, ctx.ts, source, i + 1, msg.strip())
    if fatal:
        what = fatal["what"].strip()
        exc = LogException(ctx.own_rank, ctx.ts, source, i + 1, "Fatal Python error", what)
        exc.fatal_signal = True
        ev.keep(ev.exceptions, exc)
    elif timeout:
        ev.hang_lines.append(line)
    block = [msg.strip()] + lines.slice(i + 1, end + 1)
    if dump := parse_faulthandler(block, source):
        dump.rank, dump.lineno = ctx.rank, i + 1
        ev.keep(ev.dumps, dump)
        if _taken_by_watchdog(block):
            ev.keep(ev.debug_lines, line)
    return end


def _taken_by_watchdog(block: list[str]) -> bool:
    """faulthandler names the thread that took the dump `Current thread`: the watchdog's own
    thread there (in `watchdog_thread`) means the watchdog dumped the stacks, i.e. it fired."""
    current = False
    for raw in block:
        text = raw.strip()
        if _FH_START.match(text):
            current = text.startswith("Current thread")
        elif current and (m := _FH_FRAME_IN.search(text)):
            if sig.is_watchdog_thread([m[1]]):
                return True
    return False
