"""bisect: repeat `run` trials over a matrix of switches, in parallel, into a BisectTable.

Each trial is its own `hicache-diag run ... --json --out DIR` process in its own process group,
so a trial (launcher and ranks) can be killed as a whole on timeout or Ctrl-C. Trials are forked
from a warm trial server (harness/trial_server.py: torch and the CLI imported once per bisect)
unless HICACHE_DIAG_TRIAL_START=spawn, the server does not come up, or `command` is not `run`.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from hicache_diag.diagnosis.bisect_table import (
    HOST_AXIS,
    STORAGE_AXIS,
    BisectTable,
    Cell,
    TrialResult,
)
from hicache_diag.errors import UsageError
from hicache_diag.harness.bisect_trials import (
    RUN_COMMAND,
    PlannedTrial,
    TrialRunner,
    trial_env,
)
from hicache_diag.harness.trial_server import TrialServer
from hicache_diag.runtime.protocol import SWITCHES


@dataclass(frozen=True, slots=True)
class Axis:
    name: str  # storage-backend | hicache-size | a protocol switch | a run option
    values: tuple[str, ...]

    def args(self, value: str) -> list[str]:
        """The `run` flags that set this axis to `value`."""
        if self.name in SWITCHES:
            return ["--fix", f"{self.name}={value}"]
        return [f"--{self.name}", value]


# Trials as children of the warm server (`fork`, default) or each its own interpreter (`spawn`).
TRIAL_START_ENV = "HICACHE_DIAG_TRIAL_START"


@dataclass(frozen=True, slots=True)
class BisectConfig:
    axes: tuple[Axis, ...]
    trials: int = 3
    jobs: int = 1
    base_seed: int = 0
    out: Path = Path("runs/bisect")
    run_args: tuple[str, ...] = ()  # every other `run` flag, applied to all cells
    trial_timeout_s: float = 300.0
    # The trial command; tests substitute a stand-in script for `run`.
    command: tuple[str, ...] = RUN_COMMAND

    def __post_init__(self) -> None:
        if self.trials < 1:
            raise UsageError(f"--trials must be >= 1 (got {self.trials})")
        if self.jobs < 1:
            raise UsageError(f"--jobs must be >= 1 (got {self.jobs})")
        if self.trial_timeout_s <= 0:
            raise UsageError(f"--trial-timeout must be > 0 (got {self.trial_timeout_s})")


def parse_values(flag: str, text: str) -> tuple[str, ...]:
    values = tuple(v.strip() for v in text.split(","))
    if not text.strip() or any(not v for v in values):
        raise UsageError(f"{flag} needs a comma-separated list of values (got {text!r})")
    return values


def parse_switch(spec: str, run_options: set[str] | None = None) -> Axis:
    """`NAME=v1,v2` for a protocol switch (modes checked) or any `run` option (`--NAME`)."""
    name, sep, rest = spec.partition("=")
    name = name.strip().removeprefix("--")
    if not sep or not name:
        raise UsageError(f"malformed --switch {spec!r}; expected NAME=v1,v2")
    values = parse_values(f"--switch {name}", rest)
    if name in SWITCHES:
        bad = [v for v in values if v not in SWITCHES[name].modes]
        if bad:
            modes = ", ".join(SWITCHES[name].modes)
            raise UsageError(f"unknown mode {bad[0]!r} for switch {name!r}; valid: {modes}")
    elif run_options is not None and name not in run_options:
        valid = ", ".join([*SWITCHES, *sorted(run_options)])
        raise UsageError(f"unknown switch {name!r}; valid: {valid}")
    return Axis(name, values)


def matrix(axes: tuple[Axis, ...]) -> list[dict[str, str]]:
    if not axes:
        return [{}]
    return [
        dict(zip([a.name for a in axes], combo, strict=True))
        for combo in itertools.product(*(a.values for a in axes))
    ]


def _slug(values: dict[str, str]) -> str:
    text = "_".join(f"{k}={v}" for k, v in values.items()) or "base"
    return "".join(ch if ch.isalnum() or ch in "=-_." else "-" for ch in text)


def trial_argv(cfg: BisectConfig, values: dict[str, str], seed: int, out: Path) -> list[str]:
    argv = [*cfg.command, *cfg.run_args]
    for axis in cfg.axes:
        argv += axis.args(values[axis.name])
    return argv + ["--seed", str(seed), "--out", str(out), "--json"]


def _plan(cfg: BisectConfig) -> tuple[list[Cell], list[PlannedTrial]]:
    cells = [Cell(values) for values in matrix(cfg.axes)]
    trials = []
    # Trial j uses the same seed in every cell (paired comparison between cells).
    for j in range(cfg.trials):
        for i, cell in enumerate(cells):
            seed = cfg.base_seed + j
            out = cfg.out / f"cell{i}-{_slug(cell.values)}" / f"trial{j}-seed{seed}"
            trials.append(PlannedTrial(i, seed, out, trial_argv(cfg, cell.values, seed, out)))
    return cells, trials


def describe_axis(axis: str) -> str:
    sw = SWITCHES.get(axis)
    return f": {sw.what} ({sw.upstream})" if sw else ""


OnResult = Callable[[Cell, TrialResult], None]


def run_bisect(cfg: BisectConfig, on_result: OnResult | None = None) -> BisectTable:
    """Run every trial (`cfg.jobs` at a time). Ctrl-C kills the running trials' process groups
    and returns the partial table with `interrupted` set."""
    cells, trials = _plan(cfg)
    table = BisectTable([a.name for a in cfg.axes], cells, describe=describe_axis)
    runner = TrialRunner(cfg.trial_timeout_s)
    pool = ThreadPoolExecutor(max_workers=cfg.jobs, thread_name_prefix="bisect-trial")
    futures: dict[Future, PlannedTrial] = {}
    clean = False
    try:
        runner.server = _warm_server(cfg)
        futures = {pool.submit(runner.run, t): t for t in trials}
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
            for fut in done:
                _collect(fut.result(), cells[futures[fut].cell], on_result)
        clean = True
    except KeyboardInterrupt:
        table.interrupted = True
    finally:
        if not clean:
            runner.kill_all()
        pool.shutdown(wait=True, cancel_futures=True)
        if runner.server is not None:
            runner.server.close()  # it kills and reaps any trial still running
    return table


def _warm_server(cfg: BisectConfig) -> TrialServer | None:
    if cfg.command != RUN_COMMAND or os.environ.get(TRIAL_START_ENV, "fork") == "spawn":
        return None
    return TrialServer.start(cfg.out / "trial-server.log", trial_env())


def _collect(res: TrialResult | None, cell: Cell, on_result: OnResult | None) -> None:
    if res is None:
        return
    if res.error and res.error.startswith("bad input"):
        raise UsageError(f"trial rejected its arguments: {res.error.removeprefix('bad input: ')}")
    cell.results.append(res)
    if on_result is not None:
        on_result(cell, res)


__all__ = [
    "HOST_AXIS", "STORAGE_AXIS", "Axis", "BisectConfig", "matrix", "parse_switch", "parse_values",
    "run_bisect", "trial_argv",
]  # fmt: skip
