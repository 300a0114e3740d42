"""The triage record (docs/design.md §5): one object, rendered as a rich report or `--json`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hicache_diag.evidence.ranks import RankId
from hicache_diag.evidence.verdict import CrashForm, ExitCode, Outcome, exit_code_for
from hicache_diag.rules.rank_fate import RankFate
from hicache_diag.triage.recorded import Recording
from hicache_diag.triage.stacks import StackNode

TRIAGE_SCHEMA = "hicache-diag/triage/v1"
KINDS = ("crash", "hang", "healthy", "busy", "unknown")
CAUSES = ("protocol-deadlock", "network-suspect", "straggler")
# How far the evidence carries the verdict: high (a traceback, stacks of the ranks involved),
# medium (logs alone, one snapshot), low (thin: one rank's stack, HTTP lines only, a form that
# holds only under an assumption the text does not show).
CONFIDENCES = ("high", "medium", "low")


@dataclass(slots=True)
class RankReport:
    rank: RankId
    pid: int | None
    title: str | None
    role: str
    state: str  # running|idle|blocked|crashed|exited
    wait_site: str | None
    frames: list[str] = field(default_factory=list)  # main thread, innermost first
    wait_kind: str | None = None
    progressed: bool | None = None  # None: a single sample, cannot tell
    error: str | None = None  # why no dump was taken, or the exception text
    site_frame: str | None = None  # the frame that named the wait site
    call_path: tuple[str, ...] = ()  # function names from the site frame out (not in JSON)
    fate: RankFate = RankFate.ALIVE  # what its process did, for the culprit rule (not in JSON)
    sample_kinds: tuple[str, ...] = ()  # the site kind of every sample (not in JSON)

    def to_json(self) -> dict[str, Any]:
        return {
            "pp": self.rank.pp if self.rank.known else None,
            "tp": self.rank.tp if self.rank.known else None,
            "label": self.rank.label,
            "pid": self.pid,
            "title": self.title,
            "role": self.role,
            "state": self.state,
            "wait_site": self.wait_site,
            "wait_kind": self.wait_kind,
            "progressed": self.progressed,
            "frames": self.frames,
            "site_frame": self.site_frame,
            "error": self.error,
        }


@dataclass(slots=True)
class TriageReport:
    kind: str
    form: str | None = None
    cause: str | None = None
    culprit: RankReport | None = None
    ranks: list[RankReport] = field(default_factory=list)
    stack_tree: StackNode | None = None
    evidence: list[str] = field(default_factory=list)
    next_steps: list[str] = field(default_factory=list)
    signature: str | None = None  # the root error line, or the culprit's wait site
    reason: str | None = None  # why kind is unknown
    samples: int = 0
    confidence: str = "high"
    # Who printed the evidence that decided it (triage.emitters): `scheduler`, `scheduler
    # thread Thread-3 (backup_thread_func) (backup)`, `http-server`, `client`, ...
    emitter: str | None = None
    # A production recording read beside the stacks (`hicache-diag record`), when one was found
    recording: Recording | None = None
    # What reading the logs undid to get at their lines (logs.framing_notes): collectors
    # peeled, a prefix learned from the file, wrapped or glued lines, JSON decoded, ...
    framing: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.kind not in KINDS or (self.cause is not None and self.cause not in CAUSES):
            raise ValueError(f"bad triage kind/cause: {self.kind}/{self.cause}")
        if self.confidence not in CONFIDENCES:
            raise ValueError(f"bad triage confidence: {self.confidence}")

    @property
    def exit_code(self) -> ExitCode:
        """docs/design.md §4: hang 12, A 10, B 11, a crash of another form 16, healthy/busy 0;
        `unknown` (the evidence cannot decide) 3."""
        if self.kind in ("healthy", "busy"):
            return ExitCode.OK
        if self.kind == "unknown":
            return ExitCode.UNDECIDED
        outcome = Outcome.HANG if self.kind == "hang" else Outcome.CRASH
        return exit_code_for(outcome, CrashForm(self.form) if self.form else None)

    def to_json(self) -> dict[str, Any]:
        culprit = None
        if self.culprit is not None:
            c = self.culprit
            pp, tp = (c.rank.pp, c.rank.tp) if c.rank.known else (None, None)
            culprit = {"pp": pp, "tp": tp, "pid": c.pid, "label": c.rank.label}
        return {
            "schema": TRIAGE_SCHEMA,
            "kind": self.kind,
            "form": self.form,
            "cause": self.cause,
            "culprit": culprit,
            "ranks": [r.to_json() for r in self.ranks],
            "stack_tree": self.stack_tree.to_json() if self.stack_tree else None,
            "evidence": self.evidence,
            "next_steps": self.next_steps,
            "signature": self.signature,
            "reason": self.reason,
            "samples": self.samples,
            "confidence": self.confidence,
            "emitter": self.emitter,
            "framing": self.framing,
            "exit_code": int(self.exit_code),
            "recorded": rec.recorded_json() if (rec := self.recording) and rec.ranks else None,
            "first_divergence": rec.first_divergence_json() if rec else None,
        }


def report_for(rank: RankId | None, reports: list[RankReport]) -> RankReport | None:
    """The report of `rank`, added (state crashed) when the evidence names a rank not listed."""
    found = next((r for r in reports if rank is not None and r.rank == rank), None)
    if found is None and rank is not None:
        found = RankReport(rank, None, None, "?", "crashed", None)
        reports.append(found)
    return found
