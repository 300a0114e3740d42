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
import itertools
import operator
import re
from collections.abc import Callable, Iterable

from hicache_diag.evidence.ranks import RankId, parse_rank_tokens
from hicache_diag.logs.block import Block
from hicache_diag.logs.blocks import read_block
from hicache_diag.logs.chunks import Blank
from hicache_diag.logs.dumps import on_faulthandler, on_pyspy, on_pyspy_error
from hicache_diag.logs.emitters import CLIENT_STARTS, header_kind
from hicache_diag.logs.framing_notes import FramingNotes
from hicache_diag.logs.handlers import (
    THREAD_EXC,
    on_bare_exception,
    on_fatal,
    on_headless,
    on_terminate,
    on_thread_header,
    on_traceback,
)
from hicache_diag.logs.incidents import INCIDENT_GAP_S, describe, gap_inside, gap_s
from hicache_diag.logs.lines import normalise_blocks
from hicache_diag.logs.model import (  # noqa: F401 - re-exported for triage's callers
    CUT_SHORT,
    FateLine,
    LogEvidence,
    LogException,
    LogLine,
    PyspyFailure,
    ReadCtx,
)
from hicache_diag.logs.quiet import Pending, record_text
from hicache_diag.logs.textblock import TextBlock
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


_STAMP = operator.itemgetter(slice(1, 20))  # a Block line's stamp (each starts with its label)
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
    lines: Iterable[str | Blank],
    source: str,
    on_line: Callable[[int], None] | None = None,
    *,
    fast: bool = True,
    notes: FramingNotes | None = None,
) -> LogEvidence:
    """Evidence from one log's lines (any iterable: a file streams through). `on_line(n)` is
    called every few thousand lines with the count read so far (a progress display); `fast`
    False sends every line through every handler (the reference the fast path is tested on);
    `notes` gathers what reading undid (logs/framing_notes.py), kept on the evidence."""
    return _Reader(lines, source, on_line, fast, notes or FramingNotes()).run()


class _Reader:
    """One log read line by line (a Block of plain lines, a Blank run at once), split into
    incidents at a long silence (logs/incidents.py): the evidence is the latest one's."""

    def __init__(self, lines, source: str, on_line, fast: bool, notes: FramingNotes) -> None:
        self.window = LineWindow(normalise_blocks(lines, notes))
        self.source, self.on_line, self.fast, self.notes = source, on_line, fast, notes
        self.ev = LogEvidence()
        self.ctx = ReadCtx()
        # Each rank's last line, keyed by the RankId object's identity (one per token string,
        # from _rank_of's cache): a dataclass hash per line would cost more than the line.
        self.last_seen: dict[int, tuple[RankId, str | None, int, str]] = {}
        self.hour: str | None = None  # the last stamp's date and hour: gaps are looked for
        self.stamp: str | None = None  # when it changes, against the latest stamp
        self.latest: str | None = None  # the latest full stamp (a paste may go back in time)
        self.first: str | None = None  # this incident's first stamp and line
        self.start = 0
        self.earlier: list[str] = []
        self.held: Pending | None = None  # progress lines record_text holds back

    def run(self) -> LogEvidence:
        i = 0
        while (raw := self.window.take(i, self.fast)) is not None:
            if type(raw) is Blank:  # a run of blank lines: counted, nothing else
                nxt = i + raw.n
                self.notes.blank_runs += 1
                self.notes.blank_lines += raw.n
            elif type(raw) is TextBlock:  # a read of plain SGLang lines: at C speed
                nxt = self._text(raw, i)
            elif type(raw) is Block:  # a run of plain SGLang lines: recorded at once
                nxt = self._block(raw, i)
            else:
                nxt = self._line(raw, i)  # type: ignore[arg-type]
            if self.on_line is not None and nxt >> 12 != i >> 12:
                self.on_line(nxt)
            i = nxt
        return self._finish(i)

    def _text(self, block: TextBlock, i: int) -> int:
        ctx = self.ctx
        stop, self.held = record_text(
            block, i, self.source, ctx, self.ev, self.last_seen, _bracket, self.latest, self.held
        )
        if stop == 0:
            return self._block(block.block(), i)
        if stop < len(block.ids):  # the rest from the line the full path must read
            rest = block.block()
            rest.start = stop
            self.window.resume(rest, i + stop)
        else:
            self.window.passed(i + stop)
        if self.first is None:  # the incident's first stamp: the block's first line's
            line = block.data[: block.data.find(b"\n")].decode("ascii")
            info = block.infos[block.ids[0]]
            self.first = _bracket(line[info.inside])[0]  # type: ignore[index]
        self._seen(ctx.ts, ctx.newest)  # type: ignore[arg-type]
        return i + stop

    def _release(self) -> None:
        """The progress lines record_text held back, kept now (anything else that keeps
        progress lines comes after them)."""
        self.ev.recent_progress += self.held.items()  # type: ignore[union-attr]
        self.held = None

    def _block(self, block: Block, i: int) -> int:
        if self.held is not None:
            self._release()
        # No line of the block can split the incident unless one is more than the gap past
        # the latest stamp so far (a stream may go back in time: not only its last line).
        newest = max(map(_STAMP, itertools.islice(block.raw, block.start, None)))
        if gap_s(self.latest, newest) > INCIDENT_GAP_S and gap_inside(block, self.latest):
            self.window.expand(block)  # read line by line, so the gap splits the incident
            return i
        ev, ctx = self.ev, self.ctx
        first = block.line(block.start)
        nxt = i + read_block(block, i, self.source, ctx, ev, self.last_seen, _bracket)
        self.window.resume(block, nxt)
        if ctx.ts and nxt > i:
            if self.first is None:  # the incident's first stamp: the block's first line's
                self.first = _bracket(first[1 : first.find("]", 1, 200)])[0]  # type: ignore[index]
            self._seen(ctx.ts, ctx.newest)
        return nxt

    def _line(self, raw: str, i: int) -> int:
        if self.held is not None:
            self._release()
        ctx = self.ctx
        msg, prefixed = _split_prefix(raw, ctx, self.ev)
        if prefixed and ctx.ts is not self.stamp and ctx.ts:
            if ctx.ts[:13] != self.hour and gap_s(self.latest, ctx.ts) > INCIDENT_GAP_S:
                self._split(i)
            self.first = self.first or ctx.ts
            self._seen(ctx.ts)
        ev = self.ev
        if prefixed:
            ev.labelled += 1
            if ctx.rank is not None:
                self.last_seen[id(ctx.rank)] = (ctx.rank, ctx.ts, i + 1, msg)
        elif msg[:1] in _CLIENT_FIRST and msg.startswith(CLIENT_STARTS):
            ev.client_lines += 1
        if not ev.context.hicache and has_hicache_word(msg):
            ev.context = ev.context | sig.text_context(msg)
        if self.fast and _plain(msg, prefixed, i, self.source, ctx, ev):
            return i + 1
        ctx.prefixed = prefixed
        return _consume(self.window, i, msg, prefixed, self.source, ctx, ev) + 1

    def _seen(self, ts: str, newest: str | None = None) -> None:
        """`ts`: the stamp the reader holds now; `newest`: the latest full stamp of the lines
        a block recorded (the latest may be neither, in a stream that goes back in time)."""
        self.stamp, self.hour = ts, ts[:13]
        for stamp in (ts, newest):
            if stamp and len(stamp) >= 19 and (self.latest is None or stamp > self.latest):
                self.latest = stamp

    def _split(self, i: int) -> None:
        """A silence longer than INCIDENT_GAP_S before line i: what came before is set aside."""
        self.earlier.append(describe(self.ev, self.first, self.latest, i - self.start))
        self.ev = LogEvidence(context=self.ev.context)
        self.last_seen = {}
        self.first, self.start = None, i
        ctx = self.ctx
        ctx.torn_down, ctx.noise_next, ctx.thread, ctx.header = False, False, None, None

    def _finish(self, i: int) -> LogEvidence:
        if self.held is not None:
            self._release()
        ev = self.ev
        for rank, ts, lineno, msg in sorted(self.last_seen.values(), key=lambda v: v[2]):
            ev.ranks_seen[rank] = LogLine(rank, ts, self.source, lineno, msg.strip())
        ev.lines = i
        if ev.client_lines and not ev.labelled:  # a benchmark client's own log: its tracebacks
            for exc in ev.exceptions:
                exc.header = exc.header or "client"
        ev.notes[:0] = [f"{self.source}: {note}" for note in self.earlier]
        ev.framing = [f"{self.source}: {line}" for line in self.notes.describe(i)]
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
        on_traceback,
        on_terminate,
        on_pyspy,
        on_pyspy_error,
        on_faulthandler,
        on_fatal,
        on_bare_exception,
        on_headless,
    )
    for handler in handlers:
        end = handler(lines, i, msg, source, ctx, ev)
        if end is not None:
            ev.recognised += 1
            if handler is not on_traceback:  # it keeps a noise's chained tracebacks together
                ctx.noise_next = False
            return end
    if thread := THREAD_EXC.search(msg):
        on_thread_header(lines, i, thread.group(1) or thread.group(2), source, ctx, ev)
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
