"""launcher.json's records (docs/evidence.md): how each rank process ended and what the trial
loop saw, one type each, every engine through the same writer (trials/trial.py
`write_launcher_json`) and every reader through `LauncherRecord.from_json`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hicache_diag.evidence.record import Record


@dataclass(frozen=True, slots=True)
class FirstFailure(Record):
    """launcher.json `first_failure`: the first rank to end badly as the loop saw it (`rank`
    None: the engine's own server died with no rank to blame)."""

    rank: int | None = None
    t: float | None = None
    pid: int | None = None
    exitcode: int | None = None
    signal: int | None = None


@dataclass(frozen=True, slots=True)
class HangRecord(Record):
    """launcher.json `hang` (and `interrupt_stall`: the same facts when a Ctrl-C found every rank
    without a step for a while). Keys a detector does not know are written as null."""

    stalled_ranks: list[int] = field(default_factory=list)
    last_progress: dict[str, float] = field(default_factory=dict)  # rank -> last progress, epoch s
    proc_status: dict[str, str] = field(default_factory=dict)  # rank -> psutil status then
    stopped_ranks: list[int] = field(default_factory=list)
    last_steps: dict[str, Any] | None = None  # rank -> {step, t}
    detected_at: float | None = None
    during_startup: bool | None = None
    idle_s: dict[str, float] | None = None  # interrupt_stall: seconds each rank had not stepped
    detected_by: str | None = None  # "sglang-watchdog" when SGLang's own watchdog fired
    observed_by: int | None = None  # the rank whose watchdog fired
    watchdog_line: str | None = None


@dataclass(frozen=True, slots=True)
class StacksRecord(Record):
    """launcher.json `stacks`: how the stacks were taken, and why py-spy was not enough."""

    tool: str | None = None  # "py-spy" | "faulthandler" | "py-spy (SGLang's watchdog)" | None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class RankProcess(Record):
    """launcher.json `ranks[]`: one rank's process as its engine recorded it. `state`: exited |
    crashed | killed | hung | finished (the sglang engine: still serving when the workload was
    done); `title` and `vanished` are the sglang engine's (found by process title; gone before
    its exit status could be read)."""

    rank: int = 0
    pp: int = 0
    tp: int = 0
    pid: int | None = None
    exitcode: int | None = None
    signal: int | None = None
    state: str = "exited"
    ended_at: float | None = None
    start_method: str | None = None
    title: str | None = None
    vanished: bool | None = None
    node: str | None = None  # the sglang engine's --nnodes: the node its server ran on
    host: str | None = None  # --hosts: that node's machine
    seen_by: str | None = None  # --hosts: how its facts were read there (the collector, ssh)


@dataclass(frozen=True, slots=True)
class LauncherRecord(Record):
    """launcher.json: how each rank process ended and what the trial loop saw. An engine adds
    its own keys beside these (`Engine.launcher_extra`: `engine: "sglang"`), kept in `extra`."""

    nested = {
        "ranks": RankProcess,
        "first_failure": FirstFailure,
        "hang": HangRecord,
        "interrupt_stall": HangRecord,
        "stacks": StacksRecord,
    }

    ranks: list[RankProcess] = field(default_factory=list)
    first_failure: FirstFailure | None = None
    hang: HangRecord | None = None
    stacks: StacksRecord = field(default_factory=StacksRecord)
    interrupted: bool = False
    interrupted_at: float | None = None
    interrupt_stall: HangRecord | None = None
    startup_error: str | None = None
    # What ended the run that is neither a rank's nor the user's verdict to draw: the stop
    # signal's name (SIGINT, SIGTERM, SIGHUP), or the environment failing the tool itself (a
    # full disk, EIO), which makes the verdict `undecided` naming no rank.
    interrupt_signal: str | None = None
    environment_error: str | None = None
    notes: list[str] = field(default_factory=list)  # the loop's own adjustments (a raised limit)
    timings: dict[str, float] = field(default_factory=dict)
    oom_kills: int | None = None
    startup: dict[str, Any] = field(default_factory=dict)  # {grace_s, first_step_s}
    last_steps: dict[str, Any] = field(default_factory=dict)
    started_at: str | None = None
    ended_at: str | None = None
