"""Production recordings written with the recorder's own writer (evidence/recording.py), for
the tests of triage's reading of them. Not collected by pytest (no test_ prefix)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from hicache_diag.evidence import recording as rec

FIELDS = ["rids", "extend_num_tokens", "acks_consumed", "evicted", "tree_digest"]


def line(step: int, rank: int, **over: Any) -> dict[str, Any]:
    """A busy step as the SGLang recorder writes it, the same on every rank unless `over`."""
    base = {
        "step": step,
        "rank": rank,
        "pp": rank,
        "tp": 0,
        "t": 1000.0 + step,
        "rids": [f"r{step}"],
        "extend_num_tokens": 8,
        "acks_consumed": {"write": 0, "load": 0},
        "evicted": 0,
        "tree_digest": f"d{step}",
        "idle_polls": 0,
        "must_agree": ["rids", "extend_num_tokens", "acks_consumed", "evicted", "tree_digest"],
    }
    return {**base, **over}


def small(**kw: int) -> rec.Limits:
    base = {"lines_bytes": 1 << 20, "digest_segment_bytes": 1 << 20, "digest_segments": 8}
    return rec.Limits(**{**base, "block_steps": 4, "reserve_bytes": 0, **kw})


def record(
    session: Path,
    ranks: int,
    steps: int,
    change: Callable[[int, int], dict[str, Any] | None] = lambda step, rank: {},
    limits: rec.Limits | None = None,
    pids: list[int] | None = None,
) -> dict[int, rec.RankRecording]:
    """`ranks` PP stages writing steps 1..`steps`; `change(step, rank)` overrides that line's
    keys, or returns None to leave the step out on that rank (it stopped, or folded it)."""
    limits = limits or small()
    writers = {}
    for r in range(ranks):
        pid = pids[r] if pids else 1000 + r
        meta = rec.RankMeta(r, r, 0, pid, "h", "0.5.23", FIELDS, 0.0, {"block_steps": 4})
        writers[r] = rec.RankRecording(session, meta, limits)
    for step in range(1, steps + 1):
        for r, w in writers.items():
            over = change(step, r)
            if over is not None:
                w.write_step(line(step, r, **over))
    for w in writers.values():
        w.close()
    return writers
