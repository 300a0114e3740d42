"""Each upstream bug is reproducible by one switch: the same run fails with the switch in its
legacy mode and passes in its fixed mode, everything else equal (DESIGN §2).

The baseline is the preset right after the fix merged: `full` for most switches; `l2` for the
ones whose bug only shows while the host alloc is still local (#29258, #28429). The L3 switches
(`l3-hit`, `l3-progress`) are covered by tests/e2e/test_hicache_l3.py. Slow: two runs each.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import assert_no_children

CLI = [sys.executable, "-m", "hicache_diag.cli.main", "run"]
PRESSURE = ["--max-total-tokens", "256", "--requests", "16", "--hang-timeout", "2"]

# switch -> (legacy mode, baseline preset, run args, exit codes the legacy run may give)
CASES = {
    # #27285: each rank drains its own ready acks; PP1's slow DMA -> hang (C) or pop (B)
    "ack-count": ("local", "full", [*PRESSURE, "--fault", "dma-delay:rank=1,ms=30"], {11, 12}),
    # #31425: PP1's failed alloc is local, PP0's relayed ack count then pops an empty queue (B)
    "host-alloc": ("local", "full", ["--requests", "16", "--fault", "host-alloc-fail:rank=1"],
                   {11}),
    # #28902: PP0 keeps every pp_sync isend: in-flight sends grow without bound (leak)
    "inflight-sends": ("unbounded", "full", ["--workload", "idle", "--requests", "6"], {15}),
    # #29258: a fixed host size gives the stages different token capacities; PP1's smaller pool
    # refuses a write_backup that PP0's accepts (B, with the host alloc still local)
    "host-capacity": ("local", "l2", [*PRESSURE, "--hicache-size", "96KiB"], {10, 11, 12, 13}),
    # #22759: rank 1's jittery monotonic clock picks other LRU victims (diverged, or a crash)
    "lru-clock": ("monotonic", "full", [*PRESSURE, "--fault", "clock-skew:rank=1,jitter-us=20000"],
                  {10, 11, 12, 13}),
}  # fmt: skip


def _run(tmp_path, name: str, args: list[str]) -> tuple[int, dict]:
    out = tmp_path / name
    proc = subprocess.run(
        [*CLI, *args, "--seed", "1", "--out", str(out), "--json"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.stdout.strip(), proc.stderr[-2000:]
    return proc.returncode, json.loads(proc.stdout)


@pytest.mark.slow
@pytest.mark.parametrize("switch", sorted(CASES))
def test_switch_legacy_fails_and_fixed_passes(switch, tmp_path):
    legacy, preset, args, fails_with = CASES[switch]
    base = ["--protocol", preset, *args]
    rc, v = _run(tmp_path, "legacy", [*base, "--fix", f"{switch}={legacy}"])
    assert rc in fails_with, (switch, v)
    rc, v = _run(tmp_path, "fixed", base)
    assert (rc, v["outcome"]) == (0, "ok"), (switch, v)
    assert_no_children()


@pytest.mark.slow
def test_tp_collective_unconditional_turns_the_collective_desync_into_latent_divergence(
    tmp_path,
):
    """#28429 / #26923: with the host alloc still local, PP0's TP1 backs up nothing, its ack
    queue is empty and `conditional` skips the count all-reduce that TP0 enters: the TP
    collectives desync (gloo fails on the mismatched sizes). `unconditional` keeps them paired;
    the write_backup divergence stays latent (upstream: a workaround, the root cause is #31425)."""
    base = ["--protocol", "l2", "--tp", "2", "--requests", "16", "--hang-timeout", "2"]
    base += ["--fault", "host-alloc-fail:rank=1"]
    rc, v = _run(tmp_path, "legacy", [*base, "--fix", "tp-collective=conditional"])
    assert v["outcome"] in ("crash", "hang") and v["failed_rank"] in (0, 1), v
    rc, v = _run(tmp_path, "fixed", base)
    assert v["outcome"] not in ("crash", "hang"), v
    assert (v["first_divergence"] or {}).get("source") == "host-alloc", v
    assert_no_children()
