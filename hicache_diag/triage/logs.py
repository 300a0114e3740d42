"""Parse SGLang (and hicache-diag) server logs into crash, hang and progress evidence.

Understands the `[ts PP1 ATTN_CP0 TP0]` prefix, `Scheduler hit an exception: Traceback ...`
blocks, `Exception in thread ...` (storage threads), `Pyspy dump for PID N:` blocks and py-spy's
failures, faulthandler blocks, C++ aborts, bare exception lines, the SGLang watchdog (hard, soft,
other components'), the NCCL watchdog, gloo timeouts, the `Connection closed by peer` cascade and
benign noise; `triage.lines` first undoes collector prefixes and paste damage.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from hicache_diag.rules import signatures as sig
from hicache_diag.rules.signatures import Context
from hicache_diag.triage.discover import RankId, parse_rank_tokens
from hicache_diag.triage.dumps import RankDump, parse_faulthandler, parse_pyspy_text
from hicache_diag.triage.lines import normalise
from hicache_diag.triage.log_model import (  # noqa: F401 - re-exported for triage's callers
    CUT_SHORT,
    LogEvidence,
    LogException,
    LogLine,
    PyspyFailure,
)

_PREFIX = re.compile(
    r"^\[(?:(?P<ts>\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?)\s*)?"
    r"(?P<tokens>(?:(?:DP|PP|ATTN_CP|MOE_DP|TP|EP)\d+\s*)*)\]\s?(?P<msg>.*)$"
)
_NCCL_RANK = re.compile(r"\[(?:PG \d+ )?Rank (\d+)\]|^\[rank(\d+)\]")
_TRACEBACK = "Traceback (most recent call last):"
_FRAME = re.compile(r'^\s+File "(.+?)", line (\d+), in (.+)$')
_EXC_LINE = re.compile(
    r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Warning)?)(?::\s?(.*))?$"
)
# An exception line with no traceback above it (a logger that printed only `str(e)` with its
# type, a paste that kept the last line): `torch.distributed.DistBackendError: ...`.
_BARE_EXC = re.compile(
    r"^(?P<type>(?:[a-z_][\w]*\.)*[A-Z]\w*(?:Error|Exception))(?::\s(?P<msg>.*))?$"
)
_TERMINATE = re.compile(r"terminate called after throwing an instance of '(.+?)'")
_WHAT = re.compile(r"^\s*what\(\):\s*(.*)$")
_THREAD_EXC = re.compile(r"Exception in thread (.+?):\s*$|Exception in thread (.+?):(?= Traceback)")
_PYSPY = re.compile(r"Pyspy dump for PID (\d+)")
_PYSPY_PROCESS = re.compile(r"^Process \d+: ")
_PYSPY_ERROR = re.compile(r"Pyspy failed (?:\(.*?--pid (?P<pid>\d+)\)|to dump PID (?P<pid2>\d+))")
_FH_START = re.compile(r"^(?:Current thread|Thread) 0x[0-9a-fA-F]+ \(most recent call first\):?")
_FH_BODY = re.compile(
    r'^(?:\s+File "|\s*$|(?:Current thread|Thread) 0x|Extension modules:|  <no Python frame>)'
)
# py-spy's stderr when it cannot read a process for reasons that say nothing about the target.
_PYSPY_TOOLING = re.compile(
    r"not found|No such file|Permission denied|Operation not permitted", re.I
)

PROGRESS = sig.PROGRESS
_CUT_SHORT = CUT_SHORT
# Lines between the tracebacks of one chained exception.
_CHAIN = re.compile(
    r"^(?:Traceback \(most recent call last\):|During handling of the above exception"
    r"|The above exception was the direct cause|$)"
)


@dataclass(slots=True)
class _Ctx:
    rank: RankId | None = None
    ts: str | None = None
    thread: str | None = None  # from `Exception in thread X:`, the line before its traceback
    noise_next: bool = False  # `Ignore import error ...` logged with its traceback


def _split_prefix(line: str, ctx: _Ctx, ev: LogEvidence) -> tuple[str, bool]:
    """Strip a `[ts PP TP]` prefix, remembering its rank and time for the lines that follow."""
    m = _PREFIX.match(line)
    if not m or not (m.group("ts") or m.group("tokens")):
        if line.startswith("[rank") and _NCCL_RANK.search(line):
            ctx.rank = None  # a global rank number; PP/TP unknown without the topology
        return line, False
    ctx.ts = m.group("ts") or ctx.ts
    if m.group("tokens"):
        ctx.rank = parse_rank_tokens(m.group("tokens"))
        if "PP" in m.group("tokens"):
            ev.context = ev.context | Context(pp=True)
    else:
        ctx.rank = None  # the launcher / tokenizer process: no rank tokens
    return m.group("msg"), True


@dataclass(slots=True)
class _Traceback:
    frames: list[str]
    files: list[str]
    exc_type: str
    message: str
    end: int  # index of its last line
    last_frame: str | None


def _read_traceback(lines: list[str], start: int) -> _Traceback:
    """Frames, exception type and message of the traceback whose header is at `start`."""
    frames: list[str] = []
    files: list[str] = []
    last: re.Match[str] | None = None
    i = start + 1
    while i < len(lines):
        raw = lines[i]
        if m := _FRAME.match(raw):
            frames.append(m.group(3).strip())
            files.append(m.group(1))
            last = m
        elif raw.startswith(("During handling", "The above exception", _TRACEBACK)) or not raw:
            pass
        elif not raw[0].isspace():
            where = f"{last[3].strip()} ({last[1].rsplit('/', 1)[-1]}:{last[2]})" if last else None
            text = _PREFIX.sub(r"\g<msg>", raw).strip() if _PREFIX.match(raw) else raw.strip()
            m = _EXC_LINE.match(text)
            if m:
                return _Traceback(frames, files, m.group(1), (m.group(2) or "").strip(), i, where)
            return _Traceback(frames, files, text[:80], "", i, where)
        i += 1
    return _Traceback(frames, files, "UnknownError", _CUT_SHORT, i - 1, None)


def _read_pyspy(lines: list[str], start: int, source: str, ctx: _Ctx) -> tuple[list[RankDump], int]:
    """The py-spy text after `Pyspy dump for PID N:`, up to the next prefixed log line."""
    end = start + 1
    while end < len(lines) and not _PREFIX.match(lines[end]):
        end += 1
    dumps = parse_pyspy_text(lines[start:end], source)
    for dump in dumps:
        if dump.rank is None:
            dump.rank = ctx.rank
    return dumps, end - 1


def parse_log_lines(lines: list[str], source: str) -> LogEvidence:
    lines = normalise(lines)
    ev = LogEvidence()
    ctx = _Ctx()
    i = 0
    while i < len(lines):
        msg, prefixed = _split_prefix(lines[i], ctx, ev)
        if prefixed and ctx.rank is not None:
            ev.ranks_seen[ctx.rank] = LogLine(ctx.rank, ctx.ts, source, i + 1, msg.strip())
        ev.context = ev.context | sig.text_context(msg)
        i = _consume(lines, i, msg, prefixed, source, ctx, ev) + 1
    return ev


def _consume(
    lines: list[str], i: int, msg: str, prefixed: bool, source: str, ctx: _Ctx, ev: LogEvidence
) -> int:
    """Record what line i says; return the last line index it used."""
    if sig.is_noise(msg):
        ev.noise += 1
        ctx.noise_next = True
        return i
    if not _CHAIN.match(msg.strip()):
        ctx.noise_next = False  # only the noise's own (chained) traceback follows it
    handlers = (_on_traceback, _on_terminate, _on_pyspy, _on_pyspy_error, _on_faulthandler,
                _on_fatal, _on_bare_exception)  # fmt: skip
    for handler in handlers:
        end = handler(lines, i, msg, source, ctx, ev)
        if end is not None:
            ev.recognised += 1
            if handler is not _on_traceback:  # it keeps a noise's chained tracebacks together
                ctx.noise_next = False
            return end
    if thread := _THREAD_EXC.search(msg):
        ctx.thread = thread.group(1) or thread.group(2)
        ev.recognised += 1
        return i
    line = LogLine(ctx.rank, ctx.ts, source, i + 1, msg.strip())
    if (kind := sig.watchdog_kind(msg)) or sig.is_timeout(msg):
        (ev.soft_lines if kind == "soft" else ev.hang_lines).append(line)
    elif (m := sig.DEBUG_INFO.match(msg.strip())) and m["who"] == "Scheduler":
        ev.debug_lines.append(line)
    elif sig.is_cascade(msg):
        ev.cascade_lines.append(line)
    elif PROGRESS.search(msg):
        ev.progress_lines.append(line)
    else:
        ev.recognised += int(prefixed)
        return i
    ev.recognised += 1
    return i


def _on_traceback(
    lines: list[str], i: int, msg: str, source: str, ctx: _Ctx, ev: LogEvidence
) -> int | None:
    if _TRACEBACK not in msg:
        return None
    tb = _read_traceback(lines, i)
    if ctx.noise_next:  # `Ignore import error when loading ...` with its traceback: benign
        ev.noise += 1
        return tb.end
    thread = _THREAD_EXC.search(msg)
    name = (thread.group(1) or thread.group(2)) if thread else ctx.thread
    ev.exceptions.append(
        LogException(
            ctx.rank, ctx.ts, source, i + 1, tb.exc_type, tb.message, tb.frames, name,
            tb.last_frame, tb.files, scheduler="Scheduler hit an exception" in msg,
        )
    )  # fmt: skip
    ev.context = ev.context | sig.frames_context(tb.frames, tb.files)
    ctx.thread = None
    return tb.end


def _on_terminate(
    lines: list[str], i: int, msg: str, source: str, ctx: _Ctx, ev: LogEvidence
) -> int | None:
    """A C++ abort (gloo enforce, NCCL watchdog): no Python traceback, `what():` next line."""
    if not (m := _TERMINATE.search(msg)):
        return None
    what = _WHAT.match(lines[i + 1]) if i + 1 < len(lines) else None
    exc_type = m.group(1).rsplit("::", 1)[-1]
    text = what.group(1).strip() if what else "terminate called"
    exc = LogException(ctx.rank, ctx.ts, source, i + 1, exc_type, text, fatal_signal=True)
    ev.exceptions.append(exc)
    return i + 1 if what else i


def _on_pyspy(
    lines: list[str], i: int, msg: str, source: str, ctx: _Ctx, ev: LogEvidence
) -> int | None:
    m = _PYSPY.search(msg)
    if not m and not _PYSPY_PROCESS.match(msg):
        return None
    dumps, end = _read_pyspy(lines, i if not m else i + 1, source, ctx)
    if not dumps and not m:
        return None
    for dump in dumps:
        dump.pid = dump.pid or (int(m.group(1)) if m else None)
        ev.context = ev.context | _dump_context(dump)
    ev.dumps += dumps
    return max(end, i)


def _dump_context(dump: RankDump) -> Context:
    main = dump.main_thread()
    if main is None:
        return Context()
    return sig.frames_context([f.name for f in main.frames], [f.filename for f in main.frames])


def _on_pyspy_error(
    lines: list[str], i: int, msg: str, source: str, ctx: _Ctx, ev: LogEvidence
) -> int | None:
    """`Pyspy failed (py-spy dump --pid N). Error: ...` (py-spy's stderr may follow on its own
    lines) and `All pyspy dump attempts failed for PID N.`"""
    err = _PYSPY_ERROR.search(msg)
    final = sig.PYSPY_FAILED.search(msg)
    if not err and not final:
        return None
    end = i
    text = msg
    while end + 1 < len(lines) and not _PREFIX.match(lines[end + 1]) and end - i < 6:
        nxt = lines[end + 1]
        if _TRACEBACK in nxt or _PYSPY.search(nxt):
            break
        text += " " + nxt.strip()
        end += 1
    pid_text = (err and (err["pid"] or err["pid2"])) or (final and final["pid"])
    pid = int(pid_text) if pid_text else None
    earlier = [f for f in ev.pyspy_failures if f.pid == pid and f.rank == ctx.rank]
    tooling = bool(_PYSPY_TOOLING.search(text)) or any(
        _PYSPY_TOOLING.search(f.reason) for f in earlier
    )
    stopped = "Failed to suspend" in text or (bool(final) and not tooling)
    line = LogLine(ctx.rank, ctx.ts, source, i + 1, msg.strip())
    ev.pyspy_failures.append(PyspyFailure(ctx.rank, pid, text.strip(), stopped, line))
    return end


def _on_faulthandler(
    lines: list[str], i: int, msg: str, source: str, ctx: _Ctx, ev: LogEvidence
) -> int | None:
    """faulthandler's blocks inside a log: after `Fatal Python error`, after
    `dump_traceback_later`'s `Timeout (0:05:00)!`, or on SIGUSR1."""
    fatal = sig.FATAL_PYTHON.match(msg.strip())
    timeout = msg.strip().startswith("Timeout (") and sig.is_timeout(msg.strip())
    if not (fatal or timeout or _FH_START.match(msg.strip())):
        return None
    end = i
    while end + 1 < len(lines) and (
        _FH_BODY.match(lines[end + 1]) or _FH_START.match(lines[end + 1].strip())
    ):
        end += 1
    line = LogLine(ctx.rank, ctx.ts, source, i + 1, msg.strip())
    if fatal:
        what = fatal["what"].strip()
        exc = LogException(ctx.rank, ctx.ts, source, i + 1, "Fatal Python error", what)
        exc.fatal_signal = True
        ev.exceptions.append(exc)
    elif timeout:
        ev.hang_lines.append(line)
    block = [msg.strip()] + lines[i + 1 : end + 1]
    if dump := parse_faulthandler(block, source):
        dump.rank = ctx.rank
        ev.dumps.append(dump)
    return end


def _on_fatal(
    lines: list[str], i: int, msg: str, source: str, ctx: _Ctx, ev: LogEvidence
) -> int | None:
    if not any(p.search(msg) for p in sig.FATAL_PATTERNS):
        return None
    kind = "RankDivergence" if "rank divergence" in msg else "SubprocessCrash"
    ev.exceptions.append(LogException(ctx.rank, ctx.ts, source, i + 1, kind, msg.strip()))
    return i


def _on_bare_exception(
    lines: list[str], i: int, msg: str, source: str, ctx: _Ctx, ev: LogEvidence
) -> int | None:
    """`RuntimeError: ...` on a line of its own with no `Traceback` header above it."""
    if msg[:1].isspace() or not (m := _BARE_EXC.match(msg.strip())):
        return None
    exc = LogException(ctx.rank, ctx.ts, source, i + 1, m["type"], (m["msg"] or "").strip())
    exc.thread, ctx.thread = ctx.thread, None
    ev.exceptions.append(exc)
    return i


def parse_log_file(path: Path) -> LogEvidence:
    """Raises OSError when unreadable (the CLI turns that into a one-line usage error)."""
    text = path.read_text(errors="replace")
    return parse_log_lines(text.splitlines(), str(path))
