"""Rank tokens parsed in any order; discovery finds real titled processes by cmdline."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from hicache_diag.evidence.ranks import RankId, parse_rank_tokens
from hicache_diag.triage.discover import discover_schedulers


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("sglang::scheduler_PP1_TP0", RankId(pp=1, tp=0)),
        ("sglang::scheduler_DP0_TP2_PP1", RankId(pp=1, tp=2, dp=0)),
        ("sglang::scheduler_PP1_ATTN_CP3_TP3_EP3", RankId(pp=1, tp=3, attn_cp=3, ep=3)),
        ("sglang::scheduler_DP1_PP0_MOE_DP2_TP4_EP0", RankId(pp=0, tp=4, dp=1, moe_dp=2, ep=0)),
        ("hicache-diag::scheduler_PP2_TP1", RankId(pp=2, tp=1)),
        ("PP1 ATTN_CP0 TP0", RankId(pp=1, tp=0, attn_cp=0)),
        ("sglang::scheduler_PP1", RankId(pp=1, tp=0)),
        ("pyspy_pp1_tp3", RankId(pp=1, tp=3)),
    ],
)
def test_parse_rank_tokens_any_order(text, expected):
    assert parse_rank_tokens(text) == expected


def test_no_tokens_and_lookalikes_name_no_rank():
    assert parse_rank_tokens("sglang::scheduler") is None
    assert parse_rank_tokens("STEP3 RECEPTION") is None  # EP/TP inside words are not tokens


def test_label_and_key_tolerate_absent_tokens():
    a, b = RankId(pp=1, tp=0, dp=0), RankId(pp=0, tp=3)
    assert a.label == "DP0 PP1 TP0"
    assert sorted([a, b], key=lambda r: r.key) == [b, a]


@pytest.mark.process
def test_discover_finds_titled_processes_only(no_leftover_processes):
    code = (
        "import setproctitle, time, sys; "
        "setproctitle.setproctitle(sys.argv[1]); print('up', flush=True); time.sleep(30)"
    )
    titles = ["sglang::scheduler_PP1_TP0", "hicache-diag::scheduler_PP0_TP1", "python-other"]
    procs = [
        subprocess.Popen([sys.executable, "-c", code, t], stdout=subprocess.PIPE, text=True)
        for t in titles
    ]
    try:
        for p in procs:
            p.stdout.readline()
        time.sleep(0.1)
        found = {p.pid: p for p in discover_schedulers()}
        assert found[procs[0].pid].rank == RankId(pp=1, tp=0)
        assert found[procs[1].pid].rank == RankId(pp=0, tp=1)
        assert procs[2].pid not in found
    finally:
        for p in procs:
            p.kill()
            p.wait()
            p.stdout.close()


def test_rank_only_from_scheduler_titles():
    from hicache_diag.evidence.ranks import rank_from_title

    assert rank_from_title("/opt/ep4/bin/python -m sglang.launch_server --tp 4") is None
    assert rank_from_title("sglang::scheduler_PP1_TP2 ") == RankId(pp=1, tp=2)
    assert rank_from_title("sglang::scheduler") == RankId()
