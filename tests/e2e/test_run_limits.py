"""No hidden limits (issue 22): valid sizes end `ok`, the step budget is a flag whose exhaustion is
`undecided` (never a form or a culprit), and an async depth outside its range is refused up front.

`--requests 400` (2466 steps, past the old hidden 2000-step cap) takes ~50 s on two shared
cores, so it is marked slow; the default tier runs the budget itself and the deepest slot count."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import assert_no_children

CLI = [sys.executable, "-m", "hicache_diag.cli.main", "run"]


def _run(out: Path, *args: str, timeout: float = 240) -> tuple[int, dict]:
    proc = subprocess.run(
        [*CLI, *args, "--out", str(out), "--json"], capture_output=True, text=True, timeout=timeout
    )
    assert proc.stdout.strip(), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


@pytest.mark.process
def test_step_budget_exhausted_is_undecided_not_a_form(tmp_path):
    rc, v = _run(tmp_path / "run", "--max-steps", "40")
    assert (rc, v["outcome"]) == (3, "undecided"), v
    assert v["form"] is None and v["culprit_rank"] is None and v["failed_rank"] is None, v
    assert v["signature"].startswith("step budget exhausted after 40 steps"), v["signature"]
    budget = json.loads((tmp_path / "run" / "budget.json").read_text())
    assert budget["max_steps"] == 40 and budget["unfinished_requests"] > 0, budget
    assert_no_children()


@pytest.mark.process
def test_deepest_async_depth_runs_to_ok(tmp_path):
    # loop size 10 at the top of the range: each request waits a whole loop per token
    rc, v = _run(tmp_path / "run", "--async-depth", "8", "--requests", "12")
    assert (rc, v["outcome"]) == (0, "ok"), v
    assert not (tmp_path / "run" / "budget.json").exists()
    assert_no_children()


@pytest.mark.process
def test_async_depth_31_is_refused_with_the_range(tmp_path):
    proc = subprocess.run(
        [*CLI, "--async-depth", "31", "--out", str(tmp_path / "r")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "--async-depth must be between 0 and 8 (got 31)" in proc.stderr
    assert not (tmp_path / "r").exists()


@pytest.mark.process
@pytest.mark.slow
@pytest.mark.parametrize("args", [["--requests", "400"], ["--async-depth", "8"]])
def test_big_valid_runs_are_ok(tmp_path, args):
    rc, v = _run(tmp_path / "run", *args, timeout=600)
    assert (rc, v["outcome"]) == (0, "ok"), v
    assert v["steps"] > 0
    assert_no_children()
