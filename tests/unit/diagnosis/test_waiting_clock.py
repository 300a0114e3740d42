"""SGLang 0.5.1x's waiting timeout as a divergence source: each rank drops from its own waiting
queue what its own perf_counter says is due (`Scheduler._abort_on_waiting_timeout`), recorded
per step by the plugin's `waiting-clock` probe (`d`: the rids dropped) and `waiting_timeouts`."""

from __future__ import annotations

import pandas as pd

from hicache_diag.diagnosis.divergence import first_divergence
from hicache_diag.evidence.verdict import DivergenceSource

from .builder import step_record

WAITING = DivergenceSource.WAITING_CLOCK


def _line(rank: int, step: int, dropped: list[str] | None = None, **over) -> dict:
    probe: dict = {"n": 1, "v": [0.01]}
    if dropped:
        probe["d"] = [dropped]
        over["waiting_timeouts"] = len(dropped)
    return step_record(rank, step, sources={"waiting-clock": probe}, **over)


def _frames(lines: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(lines).sort_values(["step", "rank"], kind="stable")


def _parted(drops: dict[tuple[int, int], list[str]]) -> pd.DataFrame:
    """Two stages, steps 1-3; at step 3 PP0 runs o037, PP1 o036 (the hunt's 0.5.18 run)."""
    lines = [_line(r, s, drops.get((r, s))) for r in (0, 1) for s in (1, 2)]
    lines += [
        _line(0, 3, drops.get((0, 3)), rids=["o037"], l3_hit_len={"o037": 0}),
        _line(1, 3, drops.get((1, 3)), rids=["o036"], l3_hit_len={"o036": 0}),
    ]
    return _frames(lines)


def test_a_request_dropped_on_one_stage_only_is_the_waiting_clock() -> None:
    d = first_divergence(_parted({(0, 2): ["o036"]}))
    assert d is not None and d.first.step == 3
    assert d.first.source is WAITING and d.culprit_rank == 0
    assert "rank 0 dropped o036 (step 2); rank 1 none" in d.evidence[-1]
    assert "Scheduler._abort_on_waiting_timeout" in d.evidence[-1]


def test_the_rank_that_dropped_first_is_named_when_both_dropped_different_rids() -> None:
    d = first_divergence(_parted({(1, 1): ["o035"], (0, 2): ["o036"]}))
    assert d is not None and d.first.source is WAITING and d.culprit_rank == 1


def test_the_same_drops_on_every_rank_are_not_the_source() -> None:
    same = _parted({(0, 1): ["o035"], (1, 2): ["o035"]})  # one step apart, same request
    d = first_divergence(same)
    assert d is not None and d.first.source is not WAITING
    assert first_divergence(_parted({})).first.source is not WAITING  # nothing dropped
