"""The L3 control-queue drain as a divergence source: 0.5.18's stages each drain what their own
storage threads finished (a MIN within one stage's TP group), recorded per step by the plugin's
`l3-control-queues` probe (`d`: [storage hits, backups, host-memory releases] drained)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from hicache_diag.diagnosis.classify import classify_run
from hicache_diag.diagnosis.divergence import first_divergence
from hicache_diag.evidence.verdict import DivergenceSource

from .builder import step_record

RUN = Path(__file__).resolve().parents[3] / "samples/runs/sglang-0.5.18-l3-no-fault-sources"


def test_the_committed_0_5_18_run_names_the_l3_drain() -> None:
    # PP1 drained a backup at step 45, PP0 at 46; at 47 PP0 drained 2 storage hits, PP1 none.
    verdict = classify_run(RUN)
    fd = verdict.first_divergence
    assert fd is not None and (fd.step, fd.field) == (47, "device_free")
    assert fd.source is DivergenceSource.L3_PROGRESS
    said = next(e for e in verdict.evidence if e.startswith("source l3-progress"))
    assert "{0: (2, 1, 0), 1: (0, 1, 0)}" in said and "off PP0's (rank 0): [1]" in said


def _line(rank: int, step: int, drained: list[int] | None, **over) -> dict:
    probe = {"n": 1, "v": [drained or [0, 0, 0]]}
    if drained:
        probe["d"] = [drained]
    return step_record(rank, step, sources={"l3-control-queues": probe}, **over)


def _frames(lines: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(lines).sort_values(["step", "rank"], kind="stable")


def test_equal_drains_are_not_the_source_and_unequal_ones_are() -> None:
    same = [_line(r, s, [1, 0, 0] if s == 2 else None) for r in (0, 1) for s in (1, 2)]
    parted = [*same, _line(0, 3, None, device_free=990), _line(1, 3, None)]
    d = first_divergence(_frames(parted))
    assert d is not None and d.first.source is DivergenceSource.UNKNOWN  # drains agree
    apart = [_line(r, s, [1, 0, 0] if (s, r) == (2, 0) else None) for r in (0, 1) for s in (1, 2)]
    apart += [_line(0, 3, None, device_free=990), _line(1, 3, None)]
    d = first_divergence(_frames(apart))
    assert d is not None and d.first.source is DivergenceSource.L3_PROGRESS
    assert d.culprit_rank == 1  # off PP0's drain
