"""What a parsed log holds: exceptions, notable lines, py-spy failures, process fates
(triage.logs fills it). Bounded: each list keeps its first KEEP entries (the first failure in
time is the root; later repeats add nothing) and the progress lines their last ones, with counts."""

from __future__ import annotations

from dataclasses import dataclass, field

from hicache_diag.evidence.ranks import RankId
from hicache_diag.evidence.stacks import RankDump
from hicache_diag.logs.emitters import Attribution, attribute
from hicache_diag.rules import signatures as sig
from hicache_diag.rules.process_fate import FateFact
from hicache_diag.rules.rank_fate import RankFate
from hicache_diag.rules.signatures import Context

CUT_SHORT = "traceback cut short"
KEEP = 500  # entries kept per kind of evidence
KEEP_PROGRESS = 64  # the last progress lines kept (their count is kept in full)


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
    files: list[str] = field(default_factory=list)  # the frames' file names
    fatal_signal: bool = False  # `Fatal Python error` (SIGSEGV/SIGABRT) or a C++ terminate
    scheduler: bool = False  # logged as `Scheduler hit an exception`: the scheduler died of it
    header: str | None = None  # who announced it (triage.emitters.header_kind): http|tok|sched

    @property
    def attribution(self) -> Attribution:
        """Who printed it (triage.emitters), from its framing, thread, frames and files."""
        return attribute(
            header=self.header,
            thread=self.thread,
            frames=self.frames,
            files=self.files,
            ranked=self.rank is not None,
            scheduler=self.scheduler,
        )

    @property
    def text(self) -> str:
        return f"{self.exc_type}: {self.message}" if self.message else self.exc_type

    @property
    def is_signal_exit(self) -> bool:
        return self.exc_type.rsplit(".", 1)[-1] in sig.SIGNAL_EXITS

    @property
    def is_cascade(self) -> bool:
        return self.is_signal_exit or sig.is_cascade(self.text)

    @property
    def is_timeout(self) -> bool:
        return sig.is_timeout(self.text)

    @property
    def is_incomplete(self) -> bool:
        """A traceback whose exception line is missing (the paste or the log stops early)."""
        return self.message == CUT_SHORT

    @property
    def is_thread_death(self) -> bool:
        """`Exception in thread X`: one thread died, the process (and its scheduler) lives on."""
        return self.thread is not None and self.thread != "MainThread"


@dataclass(slots=True)
class LogLine:
    rank: RankId | None
    ts: str | None
    source: str
    lineno: int
    text: str


@dataclass(slots=True)
class PyspyFailure:
    """py-spy could not read a process; `fate` is what its words say of the process
    (rules.process_fate.pyspy_fate): STOPPED when it could not suspend it (SIGSTOP, stuck in
    the kernel), EXITED when the process is gone, None when py-spy was missing or lacked
    ptrace rights (nothing said of the process)."""

    rank: RankId | None
    pid: int | None
    reason: str
    fate: RankFate | None
    line: LogLine

    @property
    def stopped(self) -> bool:
        return self.fate is RankFate.STOPPED


@dataclass(slots=True)
class FateLine:
    """A process-fate fact (rules.process_fate) and the line that told it."""

    fact: FateFact
    line: LogLine


@dataclass(slots=True)
class LogEvidence:
    exceptions: list[LogException] = field(default_factory=list)
    hang_lines: list[LogLine] = field(default_factory=list)  # timeouts: hang evidence
    soft_lines: list[LogLine] = field(default_factory=list)  # soft / other components' watchdogs
    # The scheduler watchdog's outputs other than its timeout line: `Scheduler debug info:`, the
    # older `self.cur_batch...` line, its `Pyspy dump for PID` blocks of a scheduler (before any
    # teardown), a faulthandler dump taken from its thread.
    debug_lines: list[LogLine] = field(default_factory=list)
    cascade_lines: list[LogLine] = field(default_factory=list)
    # A worker waiting on its peers or driver past a limit and saying so (vLLM's shared-memory
    # broadcast): a wait, neither a crash nor nothing.
    wait_lines: list[LogLine] = field(default_factory=list)
    # The last progress lines as (rank, ts, source, lineno, text) tuples: a LogLine per batch
    # line of a million-line log would cost more than reading it (`progress_lines` builds them).
    recent_progress: list[tuple] = field(default_factory=list)
    pyspy_failures: list[PyspyFailure] = field(default_factory=list)
    dumps: list[RankDump] = field(default_factory=list)
    ranks_seen: dict[RankId, LogLine] = field(default_factory=dict)  # rank -> its last line
    fates: list[FateLine] = field(default_factory=list)  # who stopped whom, in log order
    # The drain's reports of requests still in flight after SIGTERM (rules.process_fate)
    drain_reports: list[LogLine] = field(default_factory=list)
    context: Context = Context()
    noise: int = 0  # benign lines known not to be failures
    recognised: int = 0  # lines that matched anything we know
    lines: int = 0  # lines read (after normalising)
    progress_count: int = 0  # every progress line, of which progress_lines keeps the last
    progress_last: dict[str, int] = field(default_factory=dict)  # source -> last progress line
    served: int = 0  # HTTP requests answered (uvicorn access lines)
    dropped: int = 0  # entries not kept (over KEEP)
    notes: list[str] = field(default_factory=list)  # what reading a file noticed (a cut gzip)
    labelled: int = 0  # lines behind SGLang's label: a server's log
    client_lines: int = 0  # lines a benchmark client prints (triage.emitters.CLIENT_STARTS)
    framing: list[str] = field(default_factory=list)  # what reading undid (logs.framing_notes)

    def keep(self, items: list, item: object) -> None:
        """Append unless `items` already holds KEEP entries (counted in `dropped`)."""
        if len(items) < KEEP:
            items.append(item)
        else:
            self.dropped += 1

    def add_progress(
        self, rank: RankId | None, ts: str | None, source: str, lineno: int, text: str
    ) -> None:
        self.progress_count += 1
        self.progress_last[source] = lineno
        recent = self.recent_progress
        recent.append((rank, ts, source, lineno, text))
        if len(recent) > 2 * KEEP_PROGRESS:
            del recent[:KEEP_PROGRESS]

    @property
    def progress_lines(self) -> list[LogLine]:
        """The last progress lines kept (at most 2 x KEEP_PROGRESS), oldest first."""
        return [
            LogLine(r, ts, src, n, text.strip()) for r, ts, src, n, text in self.recent_progress
        ]

    def extend(self, other: LogEvidence) -> None:
        self.exceptions += other.exceptions
        self.hang_lines += other.hang_lines
        self.soft_lines += other.soft_lines
        self.debug_lines += other.debug_lines
        self.cascade_lines += other.cascade_lines
        self.wait_lines += other.wait_lines
        self.recent_progress += other.recent_progress
        self.pyspy_failures += other.pyspy_failures
        self.dumps += other.dumps
        self.ranks_seen.update(other.ranks_seen)
        self.fates += other.fates
        self.drain_reports += other.drain_reports
        self.context = self.context | other.context
        self.noise += other.noise
        self.recognised += other.recognised
        self.lines += other.lines
        self.progress_count += other.progress_count
        self.progress_last.update(other.progress_last)
        self.served += other.served
        self.dropped += other.dropped
        self.notes += other.notes
        self.labelled += other.labelled
        self.client_lines += other.client_lines
        self.framing += other.framing

    @property
    def watchdog_fired(self) -> bool:
        """The scheduler watchdog's own outputs without its timeout line: its debug block (or
        the older `self.cur_batch` line), its `Pyspy dump for PID` blocks of a scheduler, a
        faulthandler dump from its thread. A soft watchdog prints the same, then its soft line."""
        return bool(self.debug_lines) and not self.soft_lines

    @property
    def hang_signal(self) -> bool:
        """A timeout, or the hard scheduler watchdog's outputs."""
        return bool(self.hang_lines) or self.watchdog_fired

    def first_stop(self) -> FateLine | None:
        """The first stop from outside (the operator's SIGTERM, a child killed by SIGTERM)."""
        return next((f for f in self.fates if f.fact.stopped_from_outside), None)


@dataclass(slots=True)
class ReadCtx:
    """What the log reader holds between lines: the last rank and stamp, and state a block
    handler leaves for the lines after it."""

    rank: RankId | None = None
    ts: str | None = None
    torn_down: bool = False  # a teardown or stop line was seen: later dumps are the teardown's
    thread: str | None = None  # from `Exception in thread X:`, the line before its traceback
    noise_next: bool = False  # `Ignore import error ...` logged with its traceback
    header: tuple[int, str] | None = None  # (line index, kind) of a traceback's announcer
    prefixed: bool = False  # the line being read carries its own rank label
    # The latest full stamp of the lines a block recorded (a paste or two writers sharing a
    # stream may go back in time: its last line's stamp need not be the latest).
    newest: str | None = None

    @property
    def own_rank(self) -> RankId | None:
        """The rank the line itself names: a fatal line with no label names none, whatever
        the line before it said (a culprit comes from evidence, never from adjacency)."""
        return self.rank if self.prefixed else None
