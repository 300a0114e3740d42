"""The verdict contract of docs/design.md §4: outcomes, crash forms and exit codes, defined once."""

from __future__ import annotations

import enum
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from hicache_diag.evidence import files

VERDICT_SCHEMA = "hicache-diag/verdict/v1"


class Outcome(str, enum.Enum):
    OK = "ok"
    CRASH = "crash"
    HANG = "hang"
    DIVERGED = "diverged"
    WRONG_OUTPUT = "wrong-output"
    LEAK = "leak"
    INTERRUPTED = "interrupted"  # SIGINT/SIGTERM on the CLI: ranks reaped, evidence kept
    UNDECIDED = "undecided"  # the evidence cannot decide (a run that never stepped, torn files)


class CrashForm(str, enum.Enum):
    """A = shape mismatch, B = pop from empty list (bookkeeping), C = hang."""

    A = "A"
    B = "B"
    C = "C"


class DivergenceSource(str, enum.Enum):
    DMA_ACK_COUNT = "dma-ack-count"
    L3_HIT = "l3-hit"
    L3_PROGRESS = "l3-progress"
    HOST_ALLOC = "host-alloc"
    LRU_CLOCK = "lru-clock"
    # SGLang's session reap: each rank's own tick (`SessionController.maybe_reap(now)`) closes a
    # session and releases its tree nodes; the name is the step records' probe
    # (`sources.session-clock`, hicache_diag/evidence/probes.py).
    SESSION_CLOCK = "session-clock"
    # SGLang 0.5.1x-0.5.19's waiting timeout: each rank drops from its own waiting queue what
    # its own perf_counter says is due (`Scheduler._abort_on_waiting_timeout`); the probe
    # `sources.waiting-clock` records the rids dropped.
    WAITING_CLOCK = "waiting-clock"
    # SGLang 0.5.13+'s deferred `/flush_cache?timeout=`: each rank waits for idle until its
    # own time.monotonic() deadline (`SchedulerFlushWrapper.check_pending`), so one stage may
    # reset its tree while another gives up; the probe `sources.flush-deadline` records how.
    FLUSH_DEADLINE = "flush-deadline"
    UNKNOWN = "unknown"


class ExitCode(enum.IntEnum):
    """Exit statuses of `run` and `triage` (docs/design.md §4); `bisect` exits OK when it
    completed."""

    OK = 0
    INTERNAL_ERROR = 1
    BAD_INPUT = 2
    UNDECIDED = 3
    CHECK_MISMATCH = 4  # `run --check`: the verdict is not what the scenario's [expect] says
    FORM_A = 10
    FORM_B = 11
    FORM_C = 12
    DIVERGED = 13
    WRONG_OUTPUT = 14
    LEAK = 15
    CRASH_OTHER = 16  # an exception that is neither A nor B, or a rank killed by a signal
    INTERRUPTED = 130


def exit_code_for(outcome: Outcome, form: CrashForm | None) -> ExitCode:
    """One mapping from a verdict to the process exit status."""
    if form is CrashForm.A:
        return ExitCode.FORM_A
    if form is CrashForm.B:
        return ExitCode.FORM_B
    if form is CrashForm.C or outcome is Outcome.HANG:
        return ExitCode.FORM_C
    return {
        Outcome.OK: ExitCode.OK,
        Outcome.DIVERGED: ExitCode.DIVERGED,
        Outcome.WRONG_OUTPUT: ExitCode.WRONG_OUTPUT,
        Outcome.LEAK: ExitCode.LEAK,
        # Neither A nor B: another exception in a rank, or a rank that died from a signal (a
        # kill, the OOM killer). The system failed; the tool did not (that is exit 1 alone).
        Outcome.CRASH: ExitCode.CRASH_OTHER,
        Outcome.INTERRUPTED: ExitCode.INTERRUPTED,
        Outcome.UNDECIDED: ExitCode.UNDECIDED,
    }[outcome]


@dataclass(slots=True)
class FirstDivergence:
    step: int
    field: str
    values: dict[str, Any]  # rank (as a string key) -> value
    source: DivergenceSource = DivergenceSource.UNKNOWN


@dataclass(slots=True)
class RankState:
    rank: int
    pp: int
    tp: int
    pid: int | None = None
    state: str = "exited"  # running|idle|blocked|crashed|exited|killed
    where: str | None = None  # the frame or wait site it stopped in
    node: str | None = None  # a run across nodes (`--nnodes`): the node it ran on
    host: str | None = None  # --hosts: that node's machine

    @property
    def label(self) -> str:
        """`node-1 PP1 TP0` (`PP1 TP0` on one node): the label grammar triage uses."""
        return f"{self.node} PP{self.pp} TP{self.tp}" if self.node else f"PP{self.pp} TP{self.tp}"


@dataclass(slots=True)
class Verdict:
    outcome: Outcome
    form: CrashForm | None = None
    failed_rank: int | None = None
    culprit_rank: int | None = None
    signature: str | None = None
    first_divergence: FirstDivergence | None = None
    ranks: list[RankState] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)
    seed: int | None = None
    steps: int = 0
    duration_s: float = 0.0
    run_dir: str | None = None
    # Per rank (str key): tokens served from the device tree (`prefix_hit`), from host
    # (`host_hit`), and the tokens evicted, loaded back and written back over the run.
    cache: dict[str, dict[str, int]] = field(default_factory=dict)
    # Per rank (str key): steps whose evidence line the recorder could not build.
    recorder_errors: dict[str, int] = field(default_factory=dict)
    # The device the run ran on ("cpu", "cuda"; the manifest's): None where unknown.
    device: str | None = None
    # Read from a file (`from_json`): its keys this record does not type (a newer writer's),
    # and the record's own keys that file lacked (an older writer's), so that writing it back
    # gives the file as it was (evidence/record.py does the same for every run-dir record).
    extra: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    absent: frozenset[str] = field(default=frozenset(), repr=False, compare=False)

    @property
    def exit_code(self) -> ExitCode:
        return exit_code_for(self.outcome, self.form)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("extra", "absent", *self.absent):
            data.pop(key, None)
        for rank in data.get("ranks") or []:
            for key in ("node", "host"):  # a single-node (loopback) run's, as before
                if rank.get(key) is None:
                    rank.pop(key, None)
        data["schema"] = VERDICT_SCHEMA
        data["outcome"] = self.outcome.value
        data["form"] = self.form.value if self.form else None
        if self.first_divergence is not None:
            data["first_divergence"]["source"] = self.first_divergence.source.value
        data["exit_code"] = int(self.exit_code)
        data.update(self.extra)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Verdict:
        """The one reader of verdict.json; KeyError / ValueError / TypeError: not a verdict."""
        fd = data.get("first_divergence")
        own = [f.name for f in fields(cls) if f.name not in ("extra", "absent")]
        derived = ("schema", "exit_code")  # written from the record, never read into it
        return cls(
            outcome=Outcome(data["outcome"]),
            form=CrashForm(data["form"]) if data.get("form") else None,
            failed_rank=data.get("failed_rank"),
            culprit_rank=data.get("culprit_rank"),
            signature=data.get("signature"),
            first_divergence=(
                FirstDivergence(
                    step=fd["step"],
                    field=fd["field"],
                    values=fd.get("values", {}),
                    source=DivergenceSource(fd.get("source", "unknown")),
                )
                if fd
                else None
            ),
            ranks=[RankState(**r) for r in data.get("ranks", [])],
            evidence=list(data.get("evidence", [])),
            seed=data.get("seed"),
            steps=data.get("steps", 0),
            duration_s=data.get("duration_s", 0.0),
            run_dir=data.get("run_dir"),
            cache=dict(data.get("cache") or {}),
            recorder_errors=dict(data.get("recorder_errors") or {}),
            device=data.get("device"),
            extra={k: v for k, v in data.items() if k not in own and k not in derived},
            absent=frozenset(k for k in own if k not in data),
        )

    @classmethod
    def read(cls, path: Path) -> Verdict:
        """verdict.json read back; OSError, ValueError (not JSON) or KeyError / TypeError (not a
        verdict) are the caller's to word."""
        data = files.read_json(path)
        if not isinstance(data, dict):
            raise TypeError(f"it holds a JSON {type(data).__name__}, not an object")
        return cls.from_json(data)

    def write(self, path: Path) -> None:
        """verdict.json, the one writer: last, atomically (docs/evidence.md)."""
        write_json_atomic(path, self.to_json())


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write JSON via a temp file + fsync + rename so a reader never sees half a verdict."""
    path.parent.mkdir(parents=True, exist_ok=True)
    files.write_atomic(path, json.dumps(data, indent=2, sort_keys=True))
