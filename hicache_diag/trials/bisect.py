"""bisect: repeat `run` trials over a matrix of switches, in parallel, into a BisectTable.

Each cell's engine config is built once (by the CLI, from the `run` flags and the cell's axis
values: one request, the engine registry's `build`); each trial is that config with its own seed
and run dir, run by the trial function in its own process in its own process group, so a trial
(engine and ranks) can be killed as a whole on timeout or Ctrl-C; its result is its verdict.json.
Trials are forked from a warm trial server (trials/trial_server.py: torch and the trial loop
imported once per bisect) unless HICACHE_DIAG_TRIAL_START=spawn or the server does not come up.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hicache_diag.diagnosis.bisect_table import (
    HOST_AXIS,
    STORAGE_AXIS,
    BisectTable,
    BisectTrial,
    Cell,
)
from hicache_diag.errors import UsageError
from hicache_diag.options.parse import AXIS_HOW
from hicache_diag.options.run_options import RunOptions
from hicache_diag.trials.bisect_trials import TRIAL, PlannedTrial, TrialRunner, trial_env
from hicache_diag.trials.engine import EngineConfig
from hicache_diag.trials.signals import sigterm_as_interrupt
from hicache_diag.trials.trial_guard import signals_deferred
from hicache_diag.trials.trial_server import TrialServer


@dataclass(frozen=True, slots=True)
class Axis:
    name: str  # storage-backend | hicache-size | a protocol switch | a run option's flag
    values: tuple[str, ...]
    switch: str = ""  # a protocol switch's description ("what (upstream)"); "" for an option
    field: str = ""  # the run option it sets (a RunOptions field); "" for a switch

    def args(self, value: str) -> list[str]:
        """The `run` flags that set this axis to `value` (the trial's reproducing line)."""
        if self.switch:
            return ["--switch", f"{self.name}={value}"]
        return [f"--{self.name}", value]

    def apply(self, options: RunOptions, value: str) -> RunOptions:
        """The cell's options: `options` with this axis at `value`, checked again."""
        how = f"{AXIS_HOW} {self.name}={value}"
        if self.switch:
            return options.with_value("switches", f"{self.name}={value}", how)
        if not self.field:
            raise ValueError(f"bisect axis {self.name!r} names no run option")
        return options.with_value(self.field, value, how)


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
    # One engine config per cell, in matrix() order: the run options with the cell's axis values
    # (Axis.apply), built by their engine (the CLI's part).
    cells: tuple[EngineConfig, ...] = ()
    # The trial function, "module:function"; tests substitute a stand-in.
    trial: str = TRIAL
    preload: tuple[str, ...] = ()  # the cells' engines' modules, for the warm trial server
    # `--warm-server`: the engine's warm pool factory (trials/warm_trials.py); None: fresh.
    warm: Callable[[Path], Any] | None = None

    def __post_init__(self) -> None:
        if self.trials < 1:
            raise UsageError(f"--trials must be >= 1 (got {self.trials})")
        if self.jobs < 1:
            raise UsageError(f"--jobs must be >= 1 (got {self.jobs})")
        if self.trial_timeout_s <= 0:
            raise UsageError(f"--trial-timeout must be > 0 (got {self.trial_timeout_s})")
        if self.warm is not None and self.jobs > 1:
            raise UsageError("--warm-server runs a cell's trials one after another: drop --jobs")


def parse_values(flag: str, text: str) -> tuple[str, ...]:
    values = tuple(v.strip() for v in text.split(","))
    if not text.strip() or any(not v for v in values):
        raise UsageError(f"{flag} needs a comma-separated list of values (got {text!r})")
    return values


def parse_switch(
    spec: str,
    run_options: Mapping[str, str] | None = None,
    switches: Mapping[str, Any] | None = None,
) -> Axis:
    """`NAME=v1,v2` for a protocol switch (modes checked; `switches`: the engines' own,
    engines.protocol_switches()) or any `run` option (`--NAME`; `run_options`: each flag's
    NAME -> the field it sets)."""
    SWITCHES = switches or {}  # noqa: N806  (the table's own name)
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
    sw = SWITCHES.get(name)
    if sw is not None:
        return Axis(name, values, f"{sw.what} ({sw.upstream})")
    return Axis(name, values, field=(run_options or {}).get(name, ""))


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


def cell_argv(cfg: BisectConfig, values: dict[str, str]) -> list[str]:
    """The `run` flags of one cell as typed: the pass-through flags, then the axis values.
    `--warm-server` says how trials are scheduled, not what one is: a trial's line leaves it
    out (its manifest's `warm_server` says whether it ran on a reused server)."""
    argv = [a for a in cfg.run_args if a != "--warm-server"]
    for axis in cfg.axes:
        argv += axis.args(values[axis.name])
    return argv


def trial_argv(cfg: BisectConfig, values: dict[str, str], seed: int, out: Path) -> list[str]:
    """The `hicache-diag run` line that reproduces one trial (its manifest records it)."""
    argv = ["hicache-diag", "run", *cell_argv(cfg, values)]
    return argv + ["--seed", str(seed), "--out", str(out), "--json"]


def _plan(cfg: BisectConfig) -> tuple[list[Cell], list[PlannedTrial]]:
    cells = [Cell(values) for values in matrix(cfg.axes)]
    if len(cfg.cells) != len(cells):
        raise ValueError(f"{len(cfg.cells)} cell configs for {len(cells)} cells")
    trials = []
    # Trial j uses the same seed in every cell (paired comparison between cells).
    for j in range(cfg.trials):
        for i, cell in enumerate(cells):
            seed = cfg.base_seed + j
            out = cfg.out / f"cell{i}-{_slug(cell.values)}" / f"trial{j}-seed{seed}"
            argv = trial_argv(cfg, cell.values, seed, out)
            trials.append(PlannedTrial(i, seed, out, argv, cfg.cells[i].for_trial(seed, str(out))))
    return cells, trials


def _describer(axes: tuple[Axis, ...]) -> Callable[[str], str]:
    said = {a.name: f": {a.switch}" for a in axes if a.switch}
    return lambda axis: said.get(axis, "")


OnResult = Callable[[Cell, BisectTrial], None]


def run_bisect(cfg: BisectConfig, on_result: OnResult | None = None) -> BisectTable:
    """Run every trial (`cfg.jobs` at a time). Ctrl-C (or SIGTERM) kills the running trials'
    process groups and returns the partial table with `interrupted` set."""
    with sigterm_as_interrupt():
        return _run_bisect(cfg, on_result)


def _run_bisect(cfg: BisectConfig, on_result: OnResult | None) -> BisectTable:
    cells, trials = _plan(cfg)
    table = BisectTable([a.name for a in cfg.axes], cells, describe=_describer(cfg.axes))
    if cfg.warm is not None:  # one after another in this process, each cell on its server
        from hicache_diag.trials.warm_trials import run_warm_cells

        try:
            where = (cfg.out, cfg.trial_timeout_s)
            table.interrupted = run_warm_cells(cfg.warm, where, cells, trials, on_result)
        except KeyboardInterrupt:
            table.interrupted = True
        return table
    runner = TrialRunner(cfg.trial_timeout_s, trial_fn=cfg.trial)
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
        # The reaping is not cut short, and a stop signal meanwhile stops nothing more: the
        # trials are over or being killed already (a Ctrl-C as the last one ends keeps the
        # table, whole).
        with signals_deferred(drop=True):
            if not clean:
                runner.kill_all()
            pool.shutdown(wait=True, cancel_futures=True)
            if runner.server is not None:
                runner.server.close()  # it kills and reaps any trial still running
    return table


def _warm_server(cfg: BisectConfig) -> TrialServer | None:
    if os.environ.get(TRIAL_START_ENV, "fork") == "spawn":
        return None
    return TrialServer.start(cfg.out / "trial-server.log", trial_env(), modules=cfg.preload)


def _collect(res: BisectTrial | None, cell: Cell, on_result: OnResult | None) -> None:
    if res is None:
        return
    if res.error and res.error.startswith("bad input"):
        raise UsageError(f"trial rejected its arguments: {res.error.removeprefix('bad input: ')}")
    cell.results.append(res)
    if on_result is not None:
        on_result(cell, res)


__all__ = [
    "HOST_AXIS",
    "STORAGE_AXIS",
    "Axis",
    "BisectConfig",
    "cell_argv",
    "matrix",
    "parse_switch",
    "parse_values",
    "run_bisect",
    "trial_argv",
]
