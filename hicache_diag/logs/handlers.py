"""The log reader's handlers for a line that starts a block or is evidence on its own: a
traceback (headed, or headless: its frames with no header), `Exception in thread X:`, a C++
abort, SGLang's fatal one-liners, a bare exception line (logs/parse.py runs them in order)."""

from __future__ import annotations

import re

from hicache_diag.logs.emitters import header_kind
from hicache_diag.logs.model import (
    CUT_SHORT,
    FateLine,
    LogEvidence,
    LogException,
    LogLine,
    ReadCtx,
)
from hicache_diag.logs.speakers import worker_rank
from hicache_diag.logs.tracebacks import TRACEBACK, is_frame, read_traceback
from hicache_diag.logs.window import LineWindow
from hicache_diag.rules import signatures as sig
from hicache_diag.rules.process_fate import read_fate

_TRACEBACK = TRACEBACK
# An exception line with no traceback above it (a logger that printed only `str(e)` with its
# type, a paste that kept the last line): `torch.distributed.DistBackendError: ...`.
_BARE_EXC = re.compile(
    r"^(?P<type>(?:[a-z_]\w{0,80}\.){0,16}[A-Z]\w{0,120}(?:Error|Exception))(?::\s(?P<msg>.*))?$"
)
_TERMINATE = re.compile(r"terminate called after throwing an instance of '([^']{1,300})'")
_WHAT = re.compile(r"^\s*what\(\):\s*(.*)$")
THREAD_EXC = re.compile(
    r"Exception in thread ([^:]{1,200}?):\s*$|Exception in thread ([^:]{1,200}?):(?= Traceback)"
)


def on_traceback(
    lines: LineWindow, i: int, msg: str, source: str, ctx: ReadCtx, ev: LogEvidence
) -> int | None:
    if _TRACEBACK not in msg:
        return None
    tb = read_traceback(lines, i)
    if ctx.noise_next:  # `Ignore import error when loading ...` with its traceback: benign
        ev.noise += 1
        return tb.end
    return _record_traceback(tb, i, msg, source, ctx, ev)


def on_headless(
    lines: LineWindow, i: int, msg: str, source: str, ctx: ReadCtx, ev: LogEvidence
) -> int | None:
    """A traceback's frames with no `Traceback` header above them (the paste or a logger's
    per-line prefix lost it): a traceback when it ends in an exception line, or cut short
    where the text ends; frames that run into another record are a printed stack, no error."""
    if 'File "' not in msg or not is_frame(msg):
        return None
    tb = read_traceback(lines, i, headless=True)
    if tb.message == CUT_SHORT and lines.has(tb.end + 1):
        return None
    return _record_traceback(tb, i, msg, source, ctx, ev)


def _record_traceback(tb, i: int, msg: str, source: str, ctx: ReadCtx, ev: LogEvidence) -> int:
    thread = THREAD_EXC.search(msg)
    name = (thread.group(1) or thread.group(2)) if thread else ctx.thread
    header = header_kind(msg)
    if header is None and ctx.header is not None and i - ctx.header[0] <= _HEADER_REACH:
        header = ctx.header[1]
    exc = LogException(
        ctx.rank,
        ctx.ts,
        source,
        i + 1,
        tb.exc_type,
        tb.message,
        tb.frames,
        name,
        tb.last_frame,
        tb.files,
        scheduler="Scheduler hit an exception" in msg,
        header=header,
    )
    ev.keep(ev.exceptions, exc)
    ev.context = ev.context | sig.frames_context(tb.frames, tb.files)
    ctx.thread, ctx.header = None, None
    return tb.end


# Lines between an announcing line and its traceback (asyncio prints `future: <Task ...>`).
_HEADER_REACH = 3


def on_thread_header(
    lines: LineWindow, i: int, name: str, source: str, ctx: ReadCtx, ev: LogEvidence
) -> None:
    """`Exception in thread Thread-3 (backup_thread_func):`: its traceback follows, or, cut
    off, the header alone still says which thread died (recorded as a traceback cut short)."""
    ev.recognised += 1
    follows = any(lines.has(k) and _TRACEBACK in lines[k] for k in (i + 1, i + 2))
    if follows:
        ctx.thread = name
        return
    exc = LogException(ctx.rank, ctx.ts, source, i + 1, "UnknownError", CUT_SHORT, thread=name)
    ev.keep(ev.exceptions, exc)


def on_terminate(
    lines: LineWindow, i: int, msg: str, source: str, ctx: ReadCtx, ev: LogEvidence
) -> int | None:
    """A C++ abort (gloo enforce, NCCL watchdog): no Python traceback, `what():` next line."""
    if not (m := _TERMINATE.search(msg)):
        return None
    what = _WHAT.match(lines[i + 1]) if lines.has(i + 1) else None
    exc_type = m.group(1).rsplit("::", 1)[-1]
    text = what.group(1).strip() if what else "terminate called"
    exc = LogException(ctx.own_rank, ctx.ts, source, i + 1, exc_type, text, fatal_signal=True)
    ev.keep(ev.exceptions, exc)
    return i + 1 if what else i


def on_fatal(
    lines: LineWindow, i: int, msg: str, source: str, ctx: ReadCtx, ev: LogEvidence
) -> int | None:
    if not any(p.search(msg) for p in sig.FATAL_PATTERNS):
        return None
    fact = read_fate(msg)
    if fact is not None and fact.stopped_from_outside:
        return None  # a child stopped by SIGTERM / SIGINT: a fate (read next), not its crash
    rank = worker_rank(msg) or ctx.own_rank  # `Worker proc VllmWorker-3 died`: that worker
    if fact is not None:
        ev.keep(ev.fates, FateLine(fact, LogLine(rank, ctx.ts, source, i + 1, msg.strip())))
    kind = "RankDivergence" if "rank divergence" in msg else "SubprocessCrash"
    ev.keep(ev.exceptions, LogException(rank, ctx.ts, source, i + 1, kind, msg.strip()))
    return i


def on_bare_exception(
    lines: LineWindow, i: int, msg: str, source: str, ctx: ReadCtx, ev: LogEvidence
) -> int | None:
    """`RuntimeError: ...` on a line of its own with no `Traceback` header above it."""
    if msg[:1].isspace() or not (m := _BARE_EXC.match(msg.strip())):
        return None
    exc = LogException(ctx.rank, ctx.ts, source, i + 1, m["type"], (m["msg"] or "").strip())
    exc.thread, ctx.thread = ctx.thread, None
    ev.keep(ev.exceptions, exc)
    return i
