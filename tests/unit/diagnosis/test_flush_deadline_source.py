"""SGLang 0.5.13+'s deferred flush as a divergence source: each rank waits for idle until its
own monotonic deadline (`SchedulerFlushWrapper.check_pending`), recorded per step by the
plugin's `flush-deadline` probe (`d`: 'flush' when the tree was reset, 'timeout')."""

from __future__ import annotations

import pandas as pd

from hicache_diag.diagnosis.divergence import first_divergence
from hicache_diag.evidence.verdict import DivergenceSource

from .builder import step_record

FLUSH = DivergenceSource.FLUSH_DEADLINE


def _line(rank: int, step: int, ended: str | None = None, **over) -> dict:
    probe: dict = {"n": 1, "v": [0.5]}
    if ended:
        probe["d"] = [ended]
    return step_record(rank, step, sources={"flush-deadline": probe}, **over)


def _parted(endings: dict[tuple[int, int], str]) -> pd.DataFrame:
    """Two stages, steps 1-4; at step 4 their pools disagree (the 0.5.23 hunt's run: PP0 timed
    out, PP1 reset its tree at step 508, the host pools apart at 510)."""
    lines = [_line(r, s, endings.get((r, s))) for r in (0, 1) for s in (1, 2, 3)]
    lines += [_line(0, 4, device_free=354), _line(1, 4, device_free=513)]
    return pd.DataFrame(lines).sort_values(["step", "rank"], kind="stable")


def test_a_flush_one_stage_ran_and_another_gave_up_is_the_flush_deadline() -> None:
    d = first_divergence(_parted({(0, 1): "timeout", (1, 3): "flush"}))
    assert d is not None and d.first.step == 4 and d.first.source is FLUSH
    assert d.culprit_rank == 1  # off PP0's ending, the one the fix would relay
    assert "rank 0 timeout at step 1; rank 1 flush at step 3" in d.evidence[-1]
    assert "SchedulerFlushWrapper.check_pending" in d.evidence[-1]


def test_the_same_flush_at_different_steps_is_the_flush_deadline() -> None:
    d = first_divergence(_parted({(0, 1): "flush", (1, 3): "flush"}))
    assert d is not None and d.first.source is FLUSH and d.culprit_rank == 1


def test_the_same_ending_on_every_rank_is_not_the_source() -> None:
    d = first_divergence(_parted({(0, 2): "timeout", (1, 2): "timeout"}))
    assert d is not None and d.first.source is not FLUSH
    assert first_divergence(_parted({})).first.source is not FLUSH  # no flush ended
