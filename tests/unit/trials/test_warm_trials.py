"""`--warm-server`'s trial loop without an engine: a stand-in pool (the contract of
trials/warm_trials.py `WarmPool`) that writes real verdict.json files. The trials run one after
another in this process, each in bisect's run-dir layout, one pool per cell, every pool closed;
the trial timeout interrupts a trial and records it undecided; --jobs is refused."""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from hicache_diag.errors import UsageError
from hicache_diag.evidence.verdict import Outcome, Verdict, write_json_atomic
from hicache_diag.trials.bisect import Axis, BisectConfig, run_bisect
from hicache_diag.trials.trials import run_trials
from tests.unit.trials.fake_run import FakeConfig


class _Pool:
    made: list[_Pool] = []

    def __init__(self, root: Path) -> None:
        self.root, self.trials, self.closed = root, [], False
        _Pool.made.append(self)

    def trial(self, cfg, argv=None):
        out = Path(cfg.out)
        out.mkdir(parents=True, exist_ok=True)
        self.trials.append((cfg.seed, os.getpid()))
        if cfg.seed == 99:  # past the trial timeout: the timer interrupts it
            time.sleep(30)
        verdict = Verdict(Outcome.OK, seed=cfg.seed, run_dir=str(out), duration_s=0.1)
        write_json_atomic(out / "verdict.json", verdict.to_json())
        return SimpleNamespace(verdict=verdict, run_dir=out)

    def close(self) -> None:
        self.closed = True


@pytest.fixture(autouse=True)
def _fresh_pools():
    _Pool.made = []


def test_trials_run_in_this_process_on_one_pool_in_bisects_layout(tmp_path):
    seen = []
    runs, interrupted = run_trials(
        FakeConfig(), 3, 5, tmp_path, 60.0, lambda c, r: seen.append(r.seed), warm=_Pool
    )
    assert not interrupted and [r.outcome for r in runs] == ["ok"] * 3 and seen == [5, 6, 7]
    (pool,) = _Pool.made
    assert pool.closed and pool.root == tmp_path / "warm-server-cell0"
    assert pool.trials == [(5, os.getpid()), (6, os.getpid()), (7, os.getpid())]
    assert (tmp_path / "cell0-base" / "trial2-seed7" / "verdict.json").is_file()


def test_each_bisect_cell_gets_its_own_pool(tmp_path):
    axis = Axis("requests", ("4", "8"), field="requests")
    cfg = BisectConfig((axis,), 2, 1, 0, tmp_path, (), 60.0, (FakeConfig(), FakeConfig()))
    table = run_bisect(BisectConfig(**{**_fields(cfg), "warm": _Pool}))
    assert [len(c.results) for c in table.cells] == [2, 2]
    assert [p.root.name for p in _Pool.made] == ["warm-server-cell0", "warm-server-cell1"]
    assert all(p.closed and len(p.trials) == 2 for p in _Pool.made)


def test_the_trial_timeout_interrupts_a_warm_trial_and_leaves_it_undecided(tmp_path):
    runs, interrupted = run_trials(FakeConfig(), 1, 99, tmp_path, 0.5, warm=_Pool)
    assert not interrupted and runs[0].outcome == "undecided"
    assert runs[0].cause == "trial timeout 0.5s"
    assert _Pool.made[0].closed  # its server is not trusted after an interrupted trial


def test_warm_trials_refuse_parallel_jobs(tmp_path):
    with pytest.raises(UsageError, match="drop --jobs"):
        BisectConfig((), 2, 2, 0, tmp_path, (), 60.0, (FakeConfig(),), warm=_Pool)


def _fields(cfg: BisectConfig) -> dict:
    return {name: getattr(cfg, name) for name in BisectConfig.__slots__}


def test_a_trials_reproducing_line_leaves_the_scheduling_flag_out(tmp_path):
    from hicache_diag.trials.bisect import trial_argv

    cfg = BisectConfig((), 1, 1, 0, tmp_path, ("--warm-server", "--requests", "4"), 60.0)
    argv = trial_argv(cfg, {}, 3, tmp_path / "t")
    assert "--warm-server" not in argv and argv[2:4] == ["--requests", "4"]
