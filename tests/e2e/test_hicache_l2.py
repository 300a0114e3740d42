"""HiCache L2 through `hicache-diag run`: host hits, write-backs and consumed acks on every rank,
the host-capacity switch, and bad input. Real rank processes, real gloo."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "hicache_diag.cli.main", "run"]
SMALL_POOLS = ["--max-total-tokens", "128", "--hicache-size", "384KiB"]
SMALL = [*SMALL_POOLS, "--requests", "24"]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=240)


def _rows(out: Path, rank: int) -> list[dict]:
    return [json.loads(line) for line in (out / f"rank{rank}.jsonl").read_text().splitlines()]


def _total(rows: list[dict], key: str, sub: str | None = None) -> int:
    return sum((r[key][sub] if sub else r[key]) or 0 for r in rows)


def test_full_protocol_small_host_pool_is_healthy(tmp_path, no_leftover_processes):
    out = tmp_path / "run"
    proc = _run("--protocol", "full", *SMALL, "--out", str(out), "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["outcome"] == "ok", "outputs equal the reference"
    ranks = [_rows(out, r) for r in range(2)]
    for rows in ranks:
        assert _total(rows, "write_backs") > 0 and _total(rows, "load_backs") > 0
        assert _total(rows, "acks_consumed", "write") > 0
        assert _total(rows, "acks_consumed", "load") > 0
        assert rows[0]["host_capacity"] == 256, "MIN of 256 (3 layers) and 384 (2 layers)"
    digests = [[r["tree_digest"] for r in rows] for rows in ranks]
    assert digests[0] == digests[1], "every step, the same tree on both stages"


def test_host_capacity_local_keeps_per_stage_capacities(tmp_path, no_leftover_processes):
    out = tmp_path / "run"
    _run(
        "--protocol",
        "full",
        "--switch",
        "host-capacity=local",
        *SMALL_POOLS,
        "--requests",
        "4",
        "--out",
        str(out),
        "--json",
    )
    caps = [_rows(out, r)[0]["host_capacity"] for r in range(2)]
    assert caps == [256, 384], "fixed --hicache-size: bytes per token differ per stage (#29258)"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--hicache-size", "1KiB"], "holds fewer tokens than one page"),
        (["--hicache-size", "12 parsecs"], "malformed size"),
        (["--switch", "ack-count=sometimes"], "valid: local, leader-batched, leader"),
        (["--switch", "ack-counts=local"], "unknown switch"),
    ],
)
def test_bad_input_one_line_exit_2(args, needle, no_leftover_processes):
    proc = _run(*args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr
