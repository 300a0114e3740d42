"""The engine seam: what the one trial loop (trials/trial.py) asks of an engine, and what every
engine's config offers. The engines themselves are registered in hicache_diag/engines/registry.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from hicache_diag import evidence as ev
from hicache_diag.trials.hang_watch import HangWatch
from hicache_diag.trials.proc_facts import StopWatch

if TYPE_CHECKING:
    from hicache_diag.evidence.verdict import Verdict

Progress = Callable[[dict[str, Any]], None]


@dataclass
class TrialWatch:
    """What the loop saw; launcher.json is written from it (and the engine's process records)."""

    first_failure: ev.FirstFailure | None = None
    hang: ev.HangRecord | None = None
    stacks: ev.StacksRecord | None = None
    interrupted: bool = False
    interrupted_at: float | None = None
    interrupt_stall: ev.HangRecord | None = None  # the stalled ranks' facts at a Ctrl-C
    hang_watch: HangWatch | None = None
    stops: StopWatch = field(default_factory=StopWatch)
    oom_kills_before: int | None = None
    startup_error: str | None = None  # the engine never became ready (the environment's)
    interrupt_signal: str | None = None  # SIGINT, SIGTERM or SIGHUP
    environment_error: str | None = None  # a full disk, EIO: the machine failed, not a rank
    notes: list[str] = field(default_factory=list)  # the loop's own adjustments, said
    timings: dict[str, float] = field(default_factory=dict)


class RankRecord(Protocol):
    """One rank's process, as every engine records it (launcher.json `ranks`): where it sits,
    its pid, and `state` running | stopped | exited | crashed | killed | hung | finished.
    `own_facts()`: the keys only this engine records (ev.RankProcess names them)."""

    rank: int
    pp: int
    tp: int
    pid: int
    state: str
    exitcode: int | None
    signal: int | None
    ended_at: float | None

    def own_facts(self) -> dict[str, Any]: ...


def rank_process(p: RankRecord) -> ev.RankProcess:
    """launcher.json's record of one rank's process: the common fields, then the engine's own
    (a key no engine gave stays absent, as it was written)."""
    common = ("rank", "pp", "tp", "pid", "exitcode", "signal", "state", "ended_at")
    return ev.RankProcess.from_json({k: getattr(p, k) for k in common} | p.own_facts())


@dataclass(frozen=True, slots=True)
class Failure:
    """A rank (or the engine's own server: rank None) that ended badly, as the engine saw it;
    the survivors get `grace_s` to log their cascade before the loop stops the engine."""

    record: ev.FirstFailure
    grace_s: float


class Engine:
    """The contract between the one trial loop (trials/trial.py) and an engine. The loop calls,
    in this order, and owns everything else (run dir, manifest and launcher.json writing, the
    hang watch, stack dumps, classification, verdict.json):

    1. `prepare(run_dir)`: settle paths that depend on the run dir; nothing starts.
    2. `manifest(argv)`: the manifest's fields (the loop writes it, before anything starts).
    3. `start()`: launch the ranks; `wait_ready(watch, on_progress)`: block until the engine
       serves (raise errors.EngineStartError if it never does: an environment failure).
    4. `drive()`: start the workload (the builtin ranks drive their own; SGLang's is sent
       over HTTP) and anything computed beside it.
    5. Each `poll_s` while `running()`: `poll(now)` -> the failures since the last poll;
       `live()` (running or stopped) and `alive()` (running: py-spy can dump them) ranks;
       `activity()`, progress the step files cannot show; `kernel_states()` each live rank's
       kernel state; `dump_stacks(run_dir, skip)` on a hang. `busy(line)` says which step lines
       are progress (None: every line), `startup_grace(hang_timeout)` how long the first may
       take. After the first failure's grace, or on a hang (stacks taken first), `stop(state)`.
    6. `drained(watch)`: the workload ended with no failure and no hang.
    7. `close(watch)`: reap every process, on every path (twice after a second Ctrl-C).
    8. `finish_evidence(watch)`: the rest of the run dir (per-rank logs, outputs, reference),
       process facts only: judging them is the classifier's. `launcher_extra()`: the engine's
       own launcher.json keys. `amend(verdict, watch)`: what only the engine can say (a start
       that failed is the environment's).

    `ranks()` are the engine's process records (RankRecord); `faulthandler`: the ranks answer
    SIGUSR1 with their stacks; `tie_tolerance`: how close two reference logits are a tie;
    `line_clock`: a hang's `last_progress` is the ranks' own step times (else when the loop
    read them); `started_at`: the launch time.

    The methods with a body here are no-ops or the common case: an engine writes only what
    differs; the others it must write.
    """

    poll_s: float = 0.1
    busy: Callable[[dict[str, Any]], bool] | None = None  # None: every step line is progress
    faulthandler: bool = False
    line_clock: bool = False
    started_at: float = 0.0
    # Reference logits closer than this are a greedy tie (its options' `tie_tolerance`); None:
    # diagnosis's default.
    tie_tolerance: float | None = None

    def prepare(self, run_dir: Path) -> None:
        """Nothing depends on the run dir."""

    def manifest(self, argv: list[str]) -> dict[str, Any]:
        raise NotImplementedError

    def start(self) -> None:
        raise NotImplementedError

    def wait_ready(self, watch: TrialWatch, on_progress: Progress | None) -> None:
        """Ready once started (start-up is watched by the hang watch's grace)."""

    def drive(self) -> None:
        """The ranks drive their own workload."""

    def running(self) -> bool:
        raise NotImplementedError

    def poll(self, now: float) -> list[Failure]:
        raise NotImplementedError

    def ranks(self) -> list[RankRecord]:
        raise NotImplementedError

    def alive(self) -> list[RankRecord]:
        raise NotImplementedError

    def live(self) -> list[RankRecord]:
        return self.alive()

    def activity(self) -> float:
        return 0.0

    def kernel_states(self) -> dict[int, str]:
        """rank -> its kernel state (psutil's names) for each `live()` rank: read here."""
        from hicache_diag.trials.proc_facts import status_of

        return {p.rank: status_of(p.pid) for p in self.live()}

    def dump_stacks(self, run_dir: Path, skip: set[int]) -> ev.StacksRecord | None:
        """Every `alive()` rank's stack (but `skip`'s) into stacks/, where the loop cannot
        take them itself; None: the loop's own (py-spy here, then the ranks' faulthandler)."""
        return None

    def startup_grace(self, hang_timeout: float) -> float:
        from hicache_diag.trials.hang_watch import startup_grace

        return startup_grace(hang_timeout)

    def stop(self, state: str) -> None:
        raise NotImplementedError

    def drained(self, watch: TrialWatch) -> None:
        """Nothing to settle when the workload ends cleanly."""

    def close(self, watch: TrialWatch) -> None:
        raise NotImplementedError

    def finish_evidence(self, watch: TrialWatch) -> None:
        """The ranks wrote their own evidence as they ran."""

    def launcher_extra(self) -> dict[str, Any]:
        return {}

    def amend(self, verdict: Verdict, watch: TrialWatch) -> Verdict:
        return verdict


class EngineConfig(Protocol):
    """What every engine's config offers the trial loop and the CLI."""

    engine: str  # the registry name (a class attribute)
    seed: int
    out: str | None
    hang_timeout: float

    @property
    def world_size(self) -> int: ...

    def for_trial(self, seed: int, out: str) -> EngineConfig:
        """The same run with another seed and run dir, every seeded part following `seed`:
        bisect builds each cell's config once and each of its trials from it."""
        ...
