"""The engine seam: the registry the CLI reads, each engine's defaults, and the hang rule an
engine shapes (which step lines are progress, progress from outside the step files)."""

from __future__ import annotations

import inspect
import json

import pytest

from hicache_diag.engines import registry as eng
from hicache_diag.engines.builtin.engine import BuiltinEngine
from hicache_diag.engines.builtin.options import BuiltinOptions
from hicache_diag.engines.sglang.options import SglangOptions
from hicache_diag.engines.sglang.trial import SglangEngine
from hicache_diag.errors import UsageError
from hicache_diag.faults import Scenario
from hicache_diag.options.parse import from_command_line
from hicache_diag.trials import engine as contract
from hicache_diag.trials.bisect import Axis
from hicache_diag.trials.hang_watch import HangWatch


def test_every_engine_is_an_engine_and_writes_what_it_must():
    """The base's abstract methods (NotImplementedError) are each engine's own."""
    must = {
        n
        for n, f in vars(contract.Engine).items()
        if callable(f) and "NotImplementedError" in inspect.getsource(f)
    }
    assert {"manifest", "start", "poll", "close"} <= must
    for cls in (BuiltinEngine, SglangEngine):
        assert issubclass(cls, contract.Engine)
        assert all(getattr(cls, n) is not getattr(contract.Engine, n) for n in must), cls


def test_defaults_differ_per_engine_and_help_says_so():
    assert eng.ENGINES["builtin"].options().requests == 32
    assert eng.ENGINES["sglang"].options().requests == 24
    assert eng.default_help("requests") == "32 (builtin); 24 (sglang)"
    assert eng.default_help("pp") == "2"
    assert eng.default_help("protocol") == "full"  # the builtin engine's alone
    assert SglangOptions.trial_timeout_s > BuiltinOptions.trial_timeout_s


def test_unknown_engine_is_bad_input():
    with pytest.raises(UsageError, match="unknown --engine 'vllm'; valid: builtin, sglang"):
        eng.run_options(engine="vllm")


def test_options_read_flags_over_scenario_over_the_engines_default():
    scenario = Scenario(options={"pp": 4, "tp": 1, "engine": "sglang"}, path="s.toml")
    opts = eng.run_options(scenario=scenario, tp=2, faults=("rank-stall:ms=1",))
    assert isinstance(opts, SglangOptions)
    assert (opts.pp, opts.tp, opts.hang_timeout) == (4, 2, 30.0)
    assert opts.faults == ("rank-stall:ms=1",)
    assert opts.how("pp") == "scenario key 'pp'" and opts.how("tp") == "--tp"


def test_a_bisect_axis_is_the_users_pick_over_the_scenarios():
    """A release (or protocol) axis is typed on bisect's line: the scenario's own pick must not
    refuse it (the scenario pins 0.5.19; the axis runs 0.5.19 and 0.5.20)."""
    scenario = Scenario(options={"engine": "sglang", "sglang_version": "0.5.19"}, path="s.toml")
    opts = eng.run_options(scenario=scenario)
    assert not from_command_line(opts, "sglang_python")
    axis = Axis("sglang-python", ("a", "b"), field="sglang_python")
    cell = axis.apply(opts, "/venvs/sglang-0.5.20/bin/python")
    assert from_command_line(cell, "sglang_python")
    assert not from_command_line(cell, "sglang_version")  # the scenario's, still


@pytest.mark.process
def test_the_registry_imports_an_engine_only_when_asked():
    import subprocess
    import sys

    code = (
        "import sys; from hicache_diag.engines import registry as engines; "
        "engines.default_help('pp'); "
        "print('torch' in sys.modules, 'hicache_diag.engines.sglang.build' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
    # Every entry's facts read torch-free: a refusal that asks an engine stays fast.
    code = (
        "import sys; from hicache_diag.engines.registry import ENGINES; "
        "print([ENGINES[n].records_reads for n in ENGINES], 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("]")[1].strip() == "False", out.stdout


def test_the_engine_of_a_config_runs_its_trial():
    for name in eng.ENGINES:
        entry = eng.ENGINES[name]
        assert inspect.isfunction(entry.trial) and inspect.isfunction(entry.build), name
        assert entry.options.engine == name


def test_a_trial_is_its_cells_config_with_its_own_seed_and_run_dir(tmp_path):
    """bisect builds a cell once and each trial with for_trial: every seeded part follows."""
    out = str(tmp_path / "t")
    cell = eng.build(eng.run_options(protocol="legacy", requests=8))
    trial = cell.for_trial(7, out)
    assert (trial.seed, trial.workload.seed, trial.out) == (7, 7, out)
    assert trial == eng.build(eng.run_options(protocol="legacy", requests=8, seed=7, out=out))


def test_each_engine_names_its_source_tree_and_whether_it_takes_releases():
    for name in eng.ENGINES:
        assert inspect.isfunction(eng.ENGINES[name].source_tree), name
    assert eng.ENGINES["builtin"].sources(None, None).engine == "builtin"
    with pytest.raises(UsageError, match="pick SGLang releases: add --engine sglang"):
        eng.require_releases("builtin", "--sglang-python")
    eng.require_releases("sglang", "--sglang-python")
    with pytest.raises(UsageError, match="which the builtin engine does not record: .*sglang"):
        eng.require_recorded_reads("builtin")
    eng.require_recorded_reads("sglang")


def _line(path, **rec):
    with open(path, "a") as fh:
        fh.write(json.dumps(rec) + "\n")


def test_idle_lines_are_not_progress_but_answered_requests_are(tmp_path):
    hang = HangWatch(tmp_path, 1, 2.0, started=100.0, busy=SglangEngine.busy, startup_grace_s=2.0)
    _line(tmp_path / "rank0.jsonl", step=1, t=100.5)
    hang.poll(101.0)
    assert hang.stepped and not hang.stalled(102.9)
    _line(tmp_path / "rank0.jsonl", step=2, t=103.0, idle=True)
    hang.poll(103.5)
    assert hang.stalled(103.5)  # idle turns only: no progress since 101.0
    hang.note_activity(103.4)  # a request was answered
    assert not hang.stalled(104.0) and hang.stalled(105.5)
    assert hang.last_progress(line_clock=True) == {"0": 100.5}
    assert hang.last_steps() == {"0": {"step": 1, "t": 100.5}}


def test_before_any_step_the_engines_grace_applies(tmp_path):
    hang = HangWatch(tmp_path, 2, 5.0, started=0.0)
    assert hang.startup_grace_s == 15.0 and not hang.stalled(14.0) and hang.stalled(15.1)
    served = HangWatch(tmp_path, 2, 5.0, started=0.0, startup_grace_s=5.0)
    assert served.stalled(5.1)
