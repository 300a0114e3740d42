"""The inventory of real SGLang releases, when their source is on this machine (never
downloaded here): the issue's done criteria for 0.5.23 and 0.5.12.post1, read from the code.

Where: `$HICACHE_DIAG_SGLANG_RELEASES/<version>/` (an unzipped wheel, as
`pip download --no-deps sglang==V -d DIR/V && unzip DIR/V/*.whl 'sglang/*' -d DIR/V` leaves it),
else `~/.cache/hicache-diag/sglang-<version>/` (tests/unit/rules/sglang_source.py's cache), else
`$HICACHE_DIAG_SGLANG_SRC` for 0.5.23.
"""

from __future__ import annotations

import os
from dataclasses import replace
from functools import cache
from pathlib import Path

import pytest

from hicache_diag.sources.diff import diff_inventories
from hicache_diag.sources.locate import source_tree
from hicache_diag.sources.scan import scan_tree


def _candidates(version: str) -> list[Path]:
    out = []
    if root := os.environ.get("HICACHE_DIAG_SGLANG_RELEASES"):
        out.append(Path(root) / version)
    cache_home = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    out.append(cache_home / "hicache-diag" / f"sglang-{version}")
    if version == "0.5.23" and (src := os.environ.get("HICACHE_DIAG_SGLANG_SRC")):
        out.append(Path(src))
    return out


@cache
def _inventory(version: str):
    for path in _candidates(version):
        for pkg in (path / "sglang", path):
            if (pkg / "srt").is_dir():
                tree = source_tree(pkg)
                return scan_tree(replace(tree, version=version))
    pytest.skip(
        f"no sglang {version} source here (set HICACHE_DIAG_SGLANG_RELEASES; see the docstring)"
    )


def _line(inv, s) -> str:
    return (Path(inv.release.root) / "srt" / s.file).read_text().splitlines()[s.line - 1]


def _find(inv, **match):
    return [s for s in inv.sources if all(getattr(s, k) == v for k, v in match.items())]


def test_0_5_23_the_ack_count_is_min_over_tp_then_relayed_from_pp0():
    inv = _inventory("0.5.23")
    (ack,) = _find(inv, classic="dma-ack-count", function="UnifiedRadixCache._count_ready_acks")
    assert "finish_event.query()" in _line(inv, ack)
    assert ack.alignment.mechanism == "min+leader-relay" and ack.alignment.covers_pp
    assert {s.via for s in ack.alignment.steps} == {"_all_reduce_attn_groups", "_pp_sync"}
    assert "ack-release" in ack.decisions


def test_0_5_23_the_four_classic_sources_are_listed_with_their_alignment():
    inv = _inventory("0.5.23")
    hits = _find(inv, classic="l3-hit")
    assert any(s.alignment.mechanism == "min" and s.alignment.covers_pp for s in hits)
    progress = _find(inv, classic="l3-progress")
    assert any(s.alignment.mechanism == "min+leader-relay" for s in progress)
    host = _find(inv, classic="host-alloc", function="UnifiedRadixCache._execute_kv_backup")
    assert host and all(s.alignment.mechanism == "none" for s in host)
    assert "available_size()" in _line(inv, host[0])
    lru = _find(inv, classic="lru-clock", file="mem_cache/unified_cache/unified_tree_core.py")
    assert lru and all(s.alignment.mechanism == "logical" for s in lru)


def test_0_5_23_session_clock_and_flush_deadline_sources_with_file_line():
    inv = _inventory("0.5.23")
    (reap,) = _find(inv, function="Scheduler.process_input_requests", kind="clock")
    assert "time.monotonic()" in _line(inv, reap) and reap.decisions == ("session-release",)
    assert any(u.function == "SessionController.maybe_reap" for u in reap.nearest)
    assert reap.alignment.mechanism == "none"
    flush = _find(inv, file="managers/scheduler_components/flush_wrapper.py", kind="clock")
    assert {s.function for s in flush} == {
        "SchedulerFlushWrapper.handle",
        "SchedulerFlushWrapper.check_pending",
    }
    assert all(s.decisions == ("flush",) and s.alignment.mechanism == "none" for s in flush)


def test_0_5_12_post1_the_ack_count_has_no_pp_alignment():
    inv = _inventory("0.5.12.post1")
    (write,) = _find(inv, classic="dma-ack-count", function="HiRadixCache.writing_check")
    (load,) = _find(inv, classic="dma-ack-count", function="HiRadixCache.loading_check")
    assert write.alignment.mechanism == "min" and write.alignment.covers_pp is False
    assert load.alignment.mechanism == "none"


def test_diff_0_5_12_post1_to_0_5_23_shows_pp_sync_and_the_relayed_ack_count():
    d = diff_inventories(_inventory("0.5.12.post1"), _inventory("0.5.23"))
    assert d.relays_a == () and "_pp_sync" in d.relays_b
    ack = next(c for c in d.classic if c.classic == "dma-ack-count")
    assert ack.changed and "min (no PP)" in ack.a and "min+leader-relay" in ack.b
