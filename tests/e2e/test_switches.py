"""Each upstream bug is reproducible by one switch: the same run fails with the switch in its
legacy mode and passes in its fixed mode, everything else equal (docs/design.md §2).

The baseline is the preset right after the fix merged: `full` for most switches; `l2` for the
ones whose bug only shows while the host alloc is still local (#29258, #28429). The L3 switches
(`l3-hit`, `l3-progress`) are covered by tests/e2e/test_hicache_l3.py. Slow: two runs each.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import assert_no_children

CLI = [sys.executable, "-m", "hicache_diag.cli.main", "run"]
TRIAGE = [sys.executable, "-m", "hicache_diag.cli.main", "triage", "--json", "--dumps"]
SCENARIO_TP = str(Path(__file__).resolve().parents[2] / "samples" / "scenarios" / "form_c_tp.toml")
PRESSURE = ["--max-total-tokens", "256", "--requests", "16", "--hang-timeout", "2"]

# switch -> (legacy mode, baseline preset, run args, exit codes the legacy run may give)
CASES = {
    # #27285: each rank drains its own ready acks; PP1's slow DMA -> hang (C) or pop (B)
    "ack-count": ("local", "full", [*PRESSURE, "--fault", "dma-delay:rank=1,ms=30"], {11, 12}),
    # #31425: PP1's failed alloc is local, PP0's relayed ack count then pops an empty queue (B)
    "host-alloc": (
        "local",
        "full",
        ["--requests", "16", "--fault", "host-alloc-fail:rank=1"],
        {11},
    ),
    # #28902: PP0 keeps every pp_sync isend: in-flight sends grow without bound (leak)
    "inflight-sends": ("unbounded", "full", ["--workload", "idle", "--requests", "6"], {15}),
    # #29258: a fixed host size gives the stages different token capacities; PP1's smaller pool
    # refuses a write_backup that PP0's accepts (B, with the host alloc still local)
    "host-capacity": ("local", "l2", [*PRESSURE, "--hicache-size", "96KiB"], {10, 11, 12, 13}),
    # #22759: rank 1's jittery monotonic clock picks other LRU victims (diverged, or a crash)
    "lru-clock": (
        "monotonic",
        "full",
        [*PRESSURE, "--fault", "clock-skew:rank=1,jitter-us=20000"],
        {10, 11, 12, 13},
    ),
}


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
    rc, v = _run(tmp_path, "legacy", [*base, "--switch", f"{switch}={legacy}"])
    assert rc in fails_with, (switch, v)
    if switch == "lru-clock":
        # The logical clock reads no clock at all, so clock-skew would touch nothing: that
        # combination is refused up front; the fixed run is the same run without the fault.
        refused = subprocess.run([*CLI, *base], capture_output=True, text=True, timeout=60)
        assert refused.returncode == 2 and "does nothing with lru-clock=logical" in refused.stderr
        base = ["--protocol", preset, *PRESSURE]
    rc, v = _run(tmp_path, "fixed", base)
    assert (rc, v["outcome"]) == (0, "ok"), (switch, v)
    assert_no_children()


def _triage(run_dir) -> dict:
    proc = subprocess.run(
        [*TRIAGE, str(run_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.stdout.strip(), proc.stderr[-2000:]
    return json.loads(proc.stdout)


def _assert_tp_hang(run_dir, rc: int, v: dict) -> None:
    """#27489's fingerprint: TP0 waits in the HiCache count all-reduce (TP cpu group), TP1 in the
    model's all-reduce (TP device group), the last stage waits for PP0's outputs."""
    assert (rc, v["outcome"], v["form"]) == (12, "hang", "C"), v
    assert (v["failed_rank"], v["culprit_rank"]) == (0, 1), v
    assert v["first_divergence"]["source"] == "host-alloc", v
    where = {r["rank"]: r["where"] or "" for r in v["ranks"]}
    assert "all_reduce_tp" in where[0] and "check_hicache_events" in v["signature"], v
    assert "tp_all_reduce_sum" in where[1] and "_pp_launch_batch" in where[1], where
    assert sorted(p.name for p in (run_dir / "stacks").iterdir()) == [
        f"rank{r}.json" for r in range(4)
    ], "every rank's py-spy dump"


@pytest.fixture(scope="module")
def form_c_tp_run(tmp_path_factory) -> tuple:
    """The sample recipe, run once for the tests below (about 5 s)."""
    tmp = tmp_path_factory.mktemp("form_c_tp")
    rc, v = _run(tmp, "tp", ["--scenario", SCENARIO_TP])
    assert_no_children()
    return tmp / "tp", rc, v


def test_form_c_tp_scenario_hangs_in_the_hicache_tp_all_reduce(form_c_tp_run):
    _assert_tp_hang(*form_c_tp_run)


def test_triage_names_the_form_c_tp_run_a_protocol_deadlock(form_c_tp_run):
    """Triage over the run directory (stacks only): PP0 TP0 at the HiCache TP all-reduce."""
    t = _triage(form_c_tp_run[0])
    assert (t["kind"], t["form"], t["cause"]) == ("hang", "C", "protocol-deadlock"), t
    sites = {(r["pp"], r["tp"]): r["wait_site"] for r in t["ranks"]}
    assert sites[(0, 0)] == "hicache-tp-allreduce", sites
    assert sites[(0, 1)] != "hicache-tp-allreduce", "TP1 skipped the collective"
    assert t["culprit"]["pp"] == 0, t["culprit"]


@pytest.mark.slow
def test_tp_collective_conditional_hangs_and_unconditional_leaves_latent_divergence(tmp_path):
    """#28429 / #26923: with the host alloc still local, PP0's TP1 backs up nothing, its ack
    queue is empty and `conditional` skips the count all-reduce that TP0 enters on the TP cpu
    group, while TP1 goes on to the model's all-reduce on the device group: a hang (form C).
    `unconditional` keeps them paired; the write_backup divergence stays latent (upstream: a
    workaround, the root cause is #31425)."""
    base = ["--protocol", "l2", "--tp", "2", "--requests", "16", "--hang-timeout", "2"]
    base += ["--fault", "host-alloc-fail:rank=1"]
    rc, v = _run(tmp_path, "legacy", [*base, "--switch", "tp-collective=conditional"])
    _assert_tp_hang(tmp_path / "legacy", rc, v)
    rc, v = _run(tmp_path, "fixed", base)
    assert (rc, v["outcome"]) == (13, "diverged"), v
    assert (v["first_divergence"] or {}).get("source") == "host-alloc", v
    assert_no_children()
