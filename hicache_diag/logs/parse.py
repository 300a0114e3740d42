"""Parse SGLang (and hicache-diag) server logs into crash, hang and progress evidence.

Understands the `[ts PP1 ATTN_CP0 TP0]` prefix (rules.rank_labels), `Scheduler hit an
exception: Traceback ...` blocks, `Exception in thread ...` (storage threads), `Pyspy dump for
PID N:` blocks and py-spy's failures, faulthandler blocks, C++ aborts, bare exception lines, the
SGLang watchdog (hard, soft, other components', every release's wording), NCCL's watchdog and
heartbeat monitor, gloo timeouts, the `Connection closed by peer` cascade, process fates (who
stopped whom: rules.process_fate) and benign noise; `triage.lines` first undoes collector
prefixes and paste damage. Logs stream through a sliding window (`LineWindow`): memory is bounded
by the longest block (a traceback, a dump), not by the log.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable

from hicache_diag.evidence.ranks import RankId, parse_rank_tokens
from hicache_diag.logs.blocks import read_block
from hicache_diag.logs.chunks import Blank
from hicache_diag.logs.dumps import on_faulthandler, on_pyspy, on_pyspy_error
from hicache_diag.logs.emitters import CLIENT_STARTS, header_kind
from hicache_diag.logs.lines import Block, normalise_blocks
from hicache_diag.logs.model import (  # noqa: F401 - re-exported for triage's callers
    CUT_SHORT,
    FateLine,
    LogEvidence,
    LogException,
    LogLine,
    PyspyFailure,
    ReadCtx,
)
from hicache_diag.logs.speakers import worker_rank
from hicache_diag.logs.tracebacks import (  # noqa: F401
    MAX_BLOCK,
    TRACEBACK,
    is_frame,
    read_traceback,
)
from hicache_diag.logs.triggers import (
    PROGRESS_HINT,
    SCHEDULER_PROGRESS,
    has_hicache_word,
    triggered,
)
from hicache_diag.logs.window import LineWindow
from hicache_diag.rules import signatures as sig
from hicache_diag.rules.process_fate import Fate, drain_remaining, read_fate
from hicache_diag.rules.rank_labels import NCCL_RANK, split_prefix
from hicache_diag.rules.signatures import Context

_TRACEBACK = TRACEBACK
# An exception line with no traceback above it (a logger that printed only `str(e)` with its
# type, a paste that kept the last line): `torch.distributed.DistBackendError: ...`.
_BARE_EXC = re.compile(
    r"^(?P<type>(?:[a-z_]\w{0,80}\.){0,16}[A-Z]\w{0,120}(?:Error|Exception))(?::\s(?P<msg>.*))?$"
)
_TERMINATE = re.compile(r"terminate called after throwing an instance of '([^']{1,300})'")
_WHAT = re.compile(r"^\s*what\(\):\s*(.*)$")
_THREAD_EXC = re.compile(
    r"Exception in thread ([^:]{1,200}?):\s*$|Exception in thread ([^:]{1,200}?):(?= Traceback)"
)
PROGRESS = sig.PROGRESS
# Lines between the tracebacks of one chained exception.
_CHAIN = re.compile(
    r"^(?:Traceback \(most recent call last\):|During handling of the above exception"
    r"|The above exception was the direct cause|$)"
)


def _split_prefix(line: str, ctx: ReadCtx, ev: LogEvidence) -> tuple[str, bool]:
    """Strip a `[ts PP TP]` prefix, remembering its rank and time for the lines that follow."""
    if line[:1] == "[" and (j := line.find("]", 1, 200)) > 0:
        head = _bracket(line[1:j])  # the usual line: one cached look-up for stamp and rank
        if head is not None:
            ts, rank, pp = head
            ctx.ts = _dated(ts, ctx.ts) if ts else ctx.ts
            ctx.rank = rank
            if pp and not ev.context.pp:
                ev.context = ev.context | Context(pp=True)
            msg = line[j + 1 :]
            return (msg[1:] if msg[:1].isspace() else msg), True
    parts = split_prefix(line) if line[:1] == "[" or line[:1].isdigit() else None
    if parts is None:
        if line.startswith("[rank") and NCCL_RANK.search(line):
            ctx.rank = None  # a global rank number; PP/TP unknown without the topology
        return line, False
    ts, tokens, msg = parts
    ctx.ts = _dated(ts, ctx.ts) if ts else ctx.ts
    if tokens:
        ctx.rank = _rank_of(tokens)
        if not ev.context.pp and "PP" in tokens:
            ev.context = ev.context | Context(pp=True)
    else:
        ctx.rank = None  # the launcher / tokenizer process: no rank tokens
    return msg, True


def _dated(ts: str, last: str | None) -> str:
    """A stamp that lost its date (a time-only label, a cut paste) takes the date of the last
    full stamp, so stamps compare in time order."""
    if len(ts) > 12 or not last or len(last) < 19:
        return ts
    return f"{last[:10]} {ts}"


# A log names few ranks, on every line: parse each token string once.
_rank_of = functools.lru_cache(maxsize=4096)(parse_rank_tokens)


@functools.lru_cache(maxsize=8192)
def _bracket(inside: str) -> tuple[str | None, RankId | None, bool] | None:
    """(stamp, rank, has PP) of a `[...]` prefix's inside, None if it is none: a log repeats
    few of them (one stamp a second per rank), so each is parsed once."""
    parts = split_prefix(f"[{inside}]")
    if parts is None:
        return None
    ts, tokens, _ = parts
    return ts, (_rank_of(tokens) if tokens else None), bool(tokens and "PP" in tokens)


def parse_log_lines(
    lines: Iterable[str],
    source: str,
    on_line: Callable[[int], None] | None = None,
    *,
    fast: bool = True,
) -> LogEvidence:
    """Evidence from one log's lines (any iterable: a file streams through). `on_line(n)` is
    called every few thousand lines with the count read so far (a progress display); `fast`
    False sends every line through every handler (the reference the fast path is tested on)."""
    window = LineWindow(normalise_blocks(lines))
    ev = LogEvidence()
    ctx = ReadCtx()
    # Each rank's last line, keyed by the RankId object's identity (one per token string, from
    # _rank_of's cache): a dataclass hash per line would cost more than the line.
    last_seen: dict[int, tuple[RankId, str | None, int, str]] = {}
    i = 0
    while (raw := window.take(i, fast)) is not None:
        if type(raw) is Blank:  # a run of blank lines: counted, nothing else
            nxt = i + raw.n
            if on_line is not None and nxt >> 12 != i >> 12:
                on_line(nxt)
            i = nxt
            continue
        if type(raw) is Block:  # a run of plain SGLang lines: recorded at once
            nxt = i + read_block(raw, i, source, ctx, ev, last_seen, _bracket)
            window.resume(raw, nxt)
            if on_line is not None and nxt >> 12 != i >> 12:
                on_line(nxt)
            i = nxt
            continue
        msg, prefixed = _split_prefix(raw, ctx, ev)
        if prefixed:
            ev.labelled += 1
            if ctx.rank is not None:
                last_seen[id(ctx.rank)] = (ctx.rank, ctx.ts, i + 1, msg)
        elif msg[:1] in _CLIENT_FIRST and msg.startswith(CLIENT_STARTS):
            ev.client_lines += 1
        if not ev.context.hicache and has_hicache_word(msg):
            ev.context = ev.context | sig.text_context(msg)
        if fast and _plain(msg, prefixed, i, source, ctx, ev):
            nxt = i + 1
        else:
            ctx.prefixed = prefixed
            nxt = _consume(window, i, msg, prefixed, source, ctx, ev) + 1
        if on_line is not None and nxt >> 12 != i >> 12:
            on_line(nxt)
        i = nxt
    for rank, ts, lineno, msg in sorted(last_seen.values(), key=lambda v: v[2]):
        ev.ranks_seen[rank] = LogLine(rank, ts, source, lineno, msg.strip())  # latest wins
    ev.lines = i
    if ev.client_lines and not ev.labelled:  # a benchmark client's own log: its tracebacks
        for exc in ev.exceptions:
            exc.header = exc.header or "client"
    return ev


_CLIENT_FIRST = frozenset(s[0] for s in CLIENT_STARTS)


def _plain(msg: str, prefixed: bool, i: int, source: str, ctx: ReadCtx, ev: LogEvidence) -> bool:
    """The fast path: record a line that no handler needs (progress, an access line, plain
    text); False sends it down the full path."""
    if prefixed and msg.startswith(SCHEDULER_PROGRESS):
        progress = True  # SGLang's own batch line: progress, whatever it holds
    elif triggered(msg):
        return False
    else:
        progress = PROGRESS_HINT.search(msg) is not None and bool(PROGRESS.search(msg))
    if msg and not msg.isspace():
        ctx.noise_next = False
    if progress:
        ev.add_progress(ctx.rank, ctx.ts, source, i + 1, msg)
    elif " HTTP/" in msg and sig.SERVED.search(msg):
        ev.served += 1
    else:
        ev.recognised += int(prefixed)
        return True
    ev.recognised += 1
    return True


def _consume(
    lines: LineWindow, i: int, msg: str, prefixed: bool, source: str, ctx: ReadCtx, ev: LogEvidence
) -> int:
    """Record what line i says; return the last line index it used."""
    if sig.is_noise(msg):
        ev.noise += 1
        ctx.noise_next = True
        return i
    if not _CHAIN.match(msg.strip()):
        ctx.noise_next = False  # only the noise's own (chained) traceback follows it
    handlers = (
        _on_traceback,
        _on_terminate,
        on_pyspy,
        on_pyspy_error,
        on_faulthandler,
        _on_fatal,
        _on_bare_exception,
        _on_headless,
    )
    for handler in handlers:
        end = handler(lines, i, msg, source, ctx, ev)
        if end is not None:
            ev.recognised += 1
            if handler is not _on_traceback:  # it keeps a noise's chained tracebacks together
                ctx.noise_next = False
            return end
    if thread := _THREAD_EXC.search(msg):
        _on_thread_header(lines, i, thread.group(1) or thread.group(2), source, ctx, ev)
        return i
    if kind := header_kind(msg):
        ctx.header = (i, kind)  # the traceback it announces follows within a few lines
    line = LogLine(ctx.rank, ctx.ts, source, i + 1, msg.strip())
    if drain_remaining(msg):  # requests still in flight (0: the drain is done)
        ev.keep(ev.drain_reports, line)
        ev.recognised += 1
        return i
    if fact := read_fate(msg):
        ev.keep(ev.fates, FateLine(fact, line))
        ctx.torn_down = ctx.torn_down or fact.fate in (Fate.TEARDOWN, Fate.OPERATOR_STOP)
        if fact.fate is not Fate.TEARDOWN and fact.fate is not Fate.NCCL_ABORT:
            ev.recognised += 1
            return i  # a stop or a child's exit is read as a fate; teardown is also a cascade
    ev.recognised += _one_line(msg, line, ev) or int(prefixed)
    return i


def _one_line(msg: str, line: LogLine, ev: LogEvidence) -> bool:
    """Record a line that is evidence on its own (a wait, a timeout, the watchdog's output, the
    cascade, progress, an access line); False when it is none of these."""
    if sig.is_peer_wait(msg):  # vLLM: a worker waiting on its broadcast (a wait, no crash)
        ev.keep(ev.wait_lines, line)
    elif (kind := sig.watchdog_kind(msg)) or sig.is_timeout(msg):
        ev.keep(ev.soft_lines if kind == "soft" else ev.hang_lines, line)
    elif sig.is_watchdog_debug(msg):
        ev.keep(ev.debug_lines, line)
    elif sig.is_cascade(msg):
        ev.keep(ev.cascade_lines, line)
    elif PROGRESS.search(msg):
        ev.add_progress(line.rank, line.ts, line.source, line.lineno, line.text)
    elif sig.SERVED.search(msg):
        ev.served += 1
    else:
        return False
    return True


def _on_traceback(
    lines: LineWindow, i: int, msg: str, source: str, ctx: ReadCtx, ev: LogEvidence
) -> int | None:
    if _TRACEBACK not in msg:
        return None
    tb = read_traceback(lines, i)
    if ctx.noise_next:  # `Ignore import error when loading ...` with its traceback: benign
        ev.noise += 1
        return tb.end
    return _record_traceback(tb, i, msg, source, ctx, ev)


def _on_headless(
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
    thread = _THREAD_EXC.search(msg)
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


def _on_thread_header(
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


def _on_terminate(
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


def _on_fatal(
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


def _on_bare_exception(
    lines: LineWindow, i: int, msg: str, source: str, ctx: ReadCtx, ev: LogEvidence
) -> int | None:
    """`RuntimeError: ...` on a line of its own with no `Traceback` header above it."""
    if msg[:1].isspace() or not (m := _BARE_EXC.match(msg.strip())):
        return None
    exc = LogException(ctx.rank, ctx.ts, source, i + 1, m["type"], (m["msg"] or "").strip())
    exc.thread, ctx.thread = ctx.thread, None
    ev.keep(ev.exceptions, exc)
    return i
