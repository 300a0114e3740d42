"""The engine seam: what one trial asks of an engine, and the registry of engines the CLI reads
(choices, defaults, bisect's trial timeout) -- the pattern of mini-sglang's registries.

An engine is registered by the dotted names of its `build` and `trial` functions, imported only
when used, so that `--help` and bad-input refusals never import torch or SGLang.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from hicache_diag.errors import UsageError
from hicache_diag.harness import builtin
from hicache_diag.harness.request import RunRequest
from hicache_diag.sglang import defaults as sglang_defaults

if TYPE_CHECKING:
    from hicache_diag.harness.trial import TrialWatch
    from hicache_diag.verdict import Verdict

Progress = Callable[[dict[str, Any]], None]


class RankRecord(Protocol):
    """One rank's process, as every engine records it (launcher.json `ranks`): where it sits,
    its pid, and `state` running | stopped | exited | crashed | killed | hung | finished."""

    rank: int
    pp: int
    tp: int
    pid: int
    state: str
    exitcode: int | None
    signal: int | None
    ended_at: float | None

    def to_json(self) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class Failure:
    """A rank (or the engine's own server: rank None) that ended badly, as the engine saw it;
    the survivors get `grace_s` to log their cascade before the loop stops the engine."""

    record: dict[str, Any]
    grace_s: float


class Engine(Protocol):
    """The contract between the one trial loop (harness/trial.py) and an engine. The loop calls,
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
       `activity()`, progress the step files cannot show. `busy(line)` says which step lines
       are progress (None: every line), `startup_grace(hang_timeout)` how long the first may
       take. After the first failure's grace, or on a hang (stacks taken first), `stop(state)`.
    6. `drained(watch)`: the workload ended with no failure and no hang.
    7. `close(watch)`: reap every process, on every path (twice after a second Ctrl-C).
    8. `finish_evidence(watch)`: the rest of the run dir (per-rank logs, outputs, reference),
       process facts only: judging them is the classifier's. `launcher_extra()`: the engine's
       own launcher.json keys. `amend(verdict, watch)`: what only the engine can say (a start
       that failed is the environment's).

    `ranks()` are the engine's process records (RankRecord); `faulthandler`: the ranks answer
    SIGUSR1 with their stacks; `line_clock`: a hang's `last_progress` is the ranks' own step
    times (else when the loop read them); `started_at`: the launch time.
    """

    poll_s: float
    busy: Callable[[dict[str, Any]], bool] | None
    faulthandler: bool
    line_clock: bool
    started_at: float

    def prepare(self, run_dir: Path) -> None: ...
    def manifest(self, argv: list[str]) -> dict[str, Any]: ...
    def start(self) -> None: ...
    def wait_ready(self, watch: TrialWatch, on_progress: Progress | None) -> None: ...
    def drive(self) -> None: ...
    def running(self) -> bool: ...
    def poll(self, now: float) -> list[Failure]: ...
    def ranks(self) -> list[RankRecord]: ...
    def live(self) -> list[RankRecord]: ...
    def alive(self) -> list[RankRecord]: ...
    def activity(self) -> float: ...
    def startup_grace(self, hang_timeout: float) -> float: ...
    def stop(self, state: str) -> None: ...
    def drained(self, watch: TrialWatch) -> None: ...
    def close(self, watch: TrialWatch) -> None: ...
    def finish_evidence(self, watch: TrialWatch) -> None: ...
    def launcher_extra(self) -> dict[str, Any]: ...
    def amend(self, verdict: Verdict, watch: TrialWatch) -> Verdict: ...


class EngineConfig(Protocol):
    """What every engine's config offers the trial loop and the CLI."""

    engine: str  # the registry name (a class attribute)
    seed: int
    out: str | None
    hang_timeout: float

    @property
    def world_size(self) -> int: ...


@dataclass(frozen=True, slots=True)
class EngineEntry:
    """One engine. `build(request)` checks everything and returns the engine's config (bad
    input: UsageError, before anything starts); `trial(cfg, argv, on_progress)` runs one trial
    and returns harness.trial.TrialResult, verdict.json written last."""

    name: str
    summary: str
    defaults: Mapping[str, Any]
    trial_timeout_s: float
    builder: str  # "module:function"
    trial: str

    def build(self, request: RunRequest) -> EngineConfig:
        return _load(self.builder)(request)

    def run(self, cfg: EngineConfig, argv: list[str] | None, on_progress: Progress | None):
        return _load(self.trial)(cfg, argv, on_progress)


def _load(dotted: str) -> Callable[..., Any]:
    module, attr = dotted.split(":")
    return getattr(importlib.import_module(module), attr)


ENGINES: dict[str, EngineEntry] = {
    "builtin": EngineEntry(
        "builtin", "our compact runtime", builtin.DEFAULTS, builtin.TRIAL_TIMEOUT_S,
        "hicache_diag.harness.builtin:build", "hicache_diag.harness.trial:run_trial",
    ),
    "sglang": EngineEntry(
        "sglang", "the real SGLang server",
        {**builtin.DEFAULTS, **sglang_defaults.SGLANG_DEFAULTS},
        sglang_defaults.TRIAL_TIMEOUT_S,
        "hicache_diag.sglang.build:build", "hicache_diag.sglang.trial:run_sglang_trial",
    ),
}  # fmt: skip


def engine(name: str) -> EngineEntry:
    try:
        return ENGINES[name]
    except KeyError:
        raise UsageError(f"unknown --engine {name!r}; valid: {', '.join(ENGINES)}") from None


def build(request: RunRequest) -> EngineConfig:
    """The request's engine builds its config from it."""
    return engine(request.engine).build(request)


def run_trial(cfg: EngineConfig, argv: list[str] | None = None,
              on_progress: Progress | None = None):  # fmt: skip
    """One trial of whichever engine built `cfg`."""
    return engine(cfg.engine).run(cfg, argv, on_progress)


def default_help(key: str) -> str:
    """A run flag's default as --help states it: one value, or each engine's where they differ."""
    values = {name: e.defaults.get(key) for name, e in ENGINES.items()}
    if len(set(map(str, values.values()))) == 1:
        return str(values["builtin"])
    return "; ".join(f"{v} ({name})" for name, v in values.items())
