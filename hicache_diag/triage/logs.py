"""Parse SGLang (and hicache-diag) server logs into crash, hang and progress evidence.

Understands the `[ts PP1 ATTN_CP0 TP0]` prefix, `Scheduler hit an exception: Traceback ...`
blocks, `Exception in thread ...` (storage threads), `Pyspy dump for PID N:` blocks, the SGLang
watchdog, the NCCL watchdog, gloo timeouts and the `Connection closed by peer` cascade.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from hicache_diag.triage.discover import RankId, parse_rank_tokens
from hicache_diag.triage.dumps import RankDump, parse_pyspy_text

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
_TERMINATE = re.compile(r"terminate called after throwing an instance of '(.+?)'")
_WHAT = re.compile(r"^\s*what\(\):\s*(.*)$")
_THREAD_EXC = re.compile(r"Exception in thread (.+?):")
_PYSPY = re.compile(r"Pyspy dump for PID (\d+)")

HANG_PATTERNS = (
    re.compile(r"watchdog timeout", re.I),
    re.compile(r"Watchdog caught collective operation timeout"),
    re.compile(r"Timed out waiting \d+ms for (?:recv|send)"),
    re.compile(r"Exception \(either an error or timeout\) detected by watchdog"),
    re.compile(r"DistBackendError.*(?:timeout|Timed out)", re.I),
)
CASCADE_PATTERNS = (
    re.compile(r"Connection closed by peer"),
    re.compile(r"Connection reset by peer"),
    re.compile(r"Broken pipe"),
    re.compile(r"ECONNRESET|Socket closed"),
    re.compile(r"NCCL communicator was aborted"),
    re.compile(r"Received sigquit from a child process"),
    re.compile(r"kill_process_tree called"),
    re.compile(r"Subprocess .+ crashed with exit code"),  # the parent noticing, not the cause
)
# Fatal one-liners with no traceback: the rank consensus checker calls os._exit(1) after this.
FATAL_PATTERNS = (
    re.compile(r"Found rank divergence for \d+ event"),
    re.compile(r"Subprocess .+ crashed with exit code"),  # SGLang's SubprocessWatchdog
)
PROGRESS = re.compile(
    r"(?:Prefill|Decode) batch[,.]|#running-req|gen throughput|The server is fired up", re.I
)
# Exits that follow a signal (the watchdog's SIGQUIT, Ctrl-C): never a root cause.
_SIGNAL_EXITS = frozenset({"KeyboardInterrupt", "SystemExit"})


@dataclass(slots=True)
class LogException:
    """One traceback (or fatal one-liner) found in a log."""

    rank: RankId | None
    ts: str | None
    source: str
    lineno: int
    exc_type: str
    message: str
    frames: list[str] = field(default_factory=list)  # function names, outermost first
    thread: str | None = None  # set for `Exception in thread ...`
    last_frame: str | None = None  # the innermost frame, `func (file.py:line)`

    @property
    def text(self) -> str:
        return f"{self.exc_type}: {self.message}" if self.message else self.exc_type

    @property
    def is_signal_exit(self) -> bool:
        return self.exc_type.rsplit(".", 1)[-1] in _SIGNAL_EXITS

    @property
    def is_cascade(self) -> bool:
        return self.is_signal_exit or any(p.search(self.text) for p in CASCADE_PATTERNS)

    @property
    def is_timeout(self) -> bool:
        return any(p.search(self.text) for p in HANG_PATTERNS)


@dataclass(slots=True)
class LogLine:
    rank: RankId | None
    ts: str | None
    source: str
    lineno: int
    text: str


@dataclass(slots=True)
class LogEvidence:
    exceptions: list[LogException] = field(default_factory=list)
    hang_lines: list[LogLine] = field(default_factory=list)
    cascade_lines: list[LogLine] = field(default_factory=list)
    progress_lines: list[LogLine] = field(default_factory=list)
    dumps: list[RankDump] = field(default_factory=list)
    recognised: int = 0  # lines that matched anything we know

    def extend(self, other: LogEvidence) -> None:
        self.exceptions += other.exceptions
        self.hang_lines += other.hang_lines
        self.cascade_lines += other.cascade_lines
        self.progress_lines += other.progress_lines
        self.dumps += other.dumps
        self.recognised += other.recognised


@dataclass(slots=True)
class _Ctx:
    rank: RankId | None = None
    ts: str | None = None
    thread: str | None = None  # from `Exception in thread X:`, the line before its traceback


def _split_prefix(line: str, ctx: _Ctx) -> tuple[str, bool]:
    """Strip a `[ts PP TP]` prefix, remembering its rank and time for the lines that follow."""
    m = _PREFIX.match(line)
    if not m or not (m.group("ts") or m.group("tokens")):
        nccl = _NCCL_RANK.search(line)
        if nccl and line.startswith("[rank"):
            ctx.rank = None  # a global rank number; PP/TP unknown without the topology
        return line, False
    ctx.ts = m.group("ts") or ctx.ts
    ctx.rank = parse_rank_tokens(m.group("tokens")) if m.group("tokens") else ctx.rank
    return m.group("msg"), True


@dataclass(slots=True)
class _Traceback:
    frames: list[str]
    exc_type: str
    message: str
    end: int  # index of its last line
    last_frame: str | None


def _read_traceback(lines: list[str], start: int) -> _Traceback:
    """Frames, exception type and message of the traceback whose header is at `start`."""
    frames: list[str] = []
    last: re.Match[str] | None = None
    i = start + 1
    while i < len(lines):
        raw = lines[i]
        if m := _FRAME.match(raw):
            frames.append(m.group(3).strip())
            last = m
        elif raw.startswith(("During handling", "The above exception", _TRACEBACK)) or not raw:
            pass
        elif not raw[0].isspace():
            where = f"{last[3].strip()} ({last[1].rsplit('/', 1)[-1]}:{last[2]})" if last else None
            m = _EXC_LINE.match(raw.strip())
            if m:
                return _Traceback(frames, m.group(1), (m.group(2) or "").strip(), i, where)
            return _Traceback(frames, raw.strip()[:80], "", i, where)
        i += 1
    return _Traceback(frames, "UnknownError", "traceback cut short", i - 1, None)


def _read_pyspy(lines: list[str], start: int, source: str, ctx: _Ctx) -> tuple[list[RankDump], int]:
    """The py-spy text after `Pyspy dump for PID N:`, up to the next prefixed log line."""
    end = start + 1
    while end < len(lines) and not _PREFIX.match(lines[end]):
        end += 1
    dumps = parse_pyspy_text(lines[start + 1 : end], source)
    for dump in dumps:
        if dump.rank is None:
            dump.rank = ctx.rank
    return dumps, end - 1


# Prefixes a log collector adds to every line: journald/syslog (`Jul 01 18:00:57 host
# python3[123]: `) and RFC 3339 stamps (`kubectl logs --timestamps`, `docker logs -t`).
_CARRIER = re.compile(
    r"^(?:[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \S+ [^:\s]+(?:\[\d+\])?: "
    r"|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)? )"
)


def parse_log_lines(lines: list[str], source: str) -> LogEvidence:
    lines = [_CARRIER.sub("", ln.rstrip("\n"), count=1) for ln in lines]
    ev = LogEvidence()
    ctx = _Ctx()
    i = 0
    while i < len(lines):
        msg, prefixed = _split_prefix(lines[i].rstrip("\n"), ctx)
        i = _consume(lines, i, msg, prefixed, source, ctx, ev) + 1
    return ev


def _consume(
    lines: list[str], i: int, msg: str, prefixed: bool, source: str, ctx: _Ctx, ev: LogEvidence
) -> int:
    """Record what line i says; return the last line index it used."""
    for handler in (_on_traceback, _on_terminate, _on_pyspy, _on_fatal):
        end = handler(lines, i, msg, source, ctx, ev)
        if end is not None:
            ev.recognised += 1
            return end
    if thread := _THREAD_EXC.search(msg):
        ctx.thread = thread.group(1)
        return i
    line = LogLine(ctx.rank, ctx.ts, source, i + 1, msg.strip())
    for patterns, bucket in ((HANG_PATTERNS, ev.hang_lines), (CASCADE_PATTERNS, ev.cascade_lines)):
        if any(p.search(msg) for p in patterns):
            bucket.append(line)
            ev.recognised += 1
            return i
    if PROGRESS.search(msg):
        ev.progress_lines.append(line)
    ev.recognised += int(prefixed or bool(PROGRESS.search(msg)))
    return i


def _on_traceback(
    lines: list[str], i: int, msg: str, source: str, ctx: _Ctx, ev: LogEvidence
) -> int | None:
    if _TRACEBACK not in msg:
        return None
    tb = _read_traceback(lines, i)
    thread = _THREAD_EXC.search(msg)
    name = thread.group(1) if thread else ctx.thread
    ev.exceptions.append(
        LogException(
            ctx.rank, ctx.ts, source, i + 1, tb.exc_type, tb.message, tb.frames, name,
            tb.last_frame,
        )
    )  # fmt: skip
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
    ev.exceptions.append(LogException(ctx.rank, ctx.ts, source, i + 1, exc_type, text))
    return i + 1 if what else i


def _on_pyspy(
    lines: list[str], i: int, msg: str, source: str, ctx: _Ctx, ev: LogEvidence
) -> int | None:
    if not (m := _PYSPY.search(msg)):
        return None
    dumps, end = _read_pyspy(lines, i, source, ctx)
    for dump in dumps:
        dump.pid = dump.pid or int(m.group(1))
    ev.dumps += dumps
    return end


def _on_fatal(
    lines: list[str], i: int, msg: str, source: str, ctx: _Ctx, ev: LogEvidence
) -> int | None:
    if not any(p.search(msg) for p in FATAL_PATTERNS):
        return None
    kind = "RankDivergence" if "rank divergence" in msg else "SubprocessCrash"
    ev.exceptions.append(LogException(ctx.rank, ctx.ts, source, i + 1, kind, msg.strip()))
    return i


def parse_log_file(path: Path) -> LogEvidence:
    """Raises OSError when unreadable (the CLI turns that into a one-line usage error)."""
    text = path.read_text(errors="replace")
    return parse_log_lines(text.splitlines(), str(path))
