"""ddmin keeps exactly what the oracle needs; the count search finds the smallest failing n;
a shrunk run's options written as a scenario read back to the same options."""

from __future__ import annotations

import pytest

from hicache_diag.engines.builtin.options import BuiltinOptions
from hicache_diag.engines.registry import run_options
from hicache_diag.engines.sglang.options import SglangOptions
from hicache_diag.faults import load_scenario
from hicache_diag.shrink.ddmin import ddmin, smallest_count
from hicache_diag.shrink.scenario_text import scenario_text


@pytest.mark.parametrize(
    ("needed", "items"),
    [({3}, range(8)), ({1, 6}, range(8)), (set(), range(5)), ({0, 1, 2, 3}, range(4))],
)
def test_ddmin_keeps_what_the_failure_needs_and_nothing_else(needed, items):
    asked = []

    def fails(candidate):
        asked.append(tuple(candidate))
        return needed <= set(candidate)

    assert set(ddmin(list(items), fails)) == needed
    assert len(asked) < 2 ** len(list(items))  # not a search over every subset


def test_smallest_count_finds_the_threshold():
    assert smallest_count(100, lambda n: n >= 37) == 37
    assert smallest_count(10, lambda n: True) == 1
    assert smallest_count(10, lambda n: n == 10) == 10
    assert smallest_count(8, lambda n: n >= 3, low=0) == 3


@pytest.mark.parametrize(
    "options",
    [
        BuiltinOptions(
            pp=3,
            requests=5,
            protocol="legacy",
            switches=("ack-count=leader",),
            hang_timeout=3.0,
            faults=("host-alloc-fail:rank=1,after=19,until=19", "dma-delay:rank=2,ms=30"),
        ),
        SglangOptions(workload="overload", requests=48, sglang_env=("SGLANG_X=1.5",)),
    ],
)
def test_a_shrunk_run_written_as_a_scenario_reads_back_the_same(tmp_path, options):
    path = tmp_path / "s.toml"
    path.write_text(scenario_text(options, "shrunk\nfor a test"))
    back = run_options(scenario=load_scenario(path))
    assert type(back) is type(options)
    for name in ("pp", "requests", "hang_timeout", "workload", "faults"):
        assert getattr(back, name) == getattr(options, name), name
    want = (*getattr(options, "scenario_fix", ()), *getattr(options, "switches", ()))
    assert getattr(back, "scenario_fix", ()) == want
    assert getattr(back, "sglang_env", ()) == getattr(options, "sglang_env", ())
