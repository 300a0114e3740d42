"""`run --engine sglang --nnodes 2`: real SGLang 0.5.23 PP2 with PP0 on node-0 and PP1 on node-1
(SGLang's own `--nnodes 2 --node-rank i --dist-init-addr`, loopback nodes on this machine), the
0.5.23 form-B scenario (PP1's host pool short): the fault, the recorder and the verdict work as
on one node, and the verdict names the node of each rank. Start-up alone is minutes on a loaded
2-core box, so it is `slow` as well as `multinode`; skipped without an SGLang install."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = [pytest.mark.multinode, pytest.mark.slow, pytest.mark.process]

ROOT = Path(__file__).resolve().parents[2]
FORM_B = ROOT / "samples" / "scenarios" / "sglang" / "form_b_host_alloc_0.5.23.toml"


def _left_in(run_dir: Path) -> list[psutil.Process]:
    """Processes still running in the run dir (every node's server has it as its cwd)."""
    left = []
    for p in psutil.process_iter():
        try:
            if p.cwd() == str(run_dir) and p.status() != psutil.STATUS_ZOMBIE:
                left.append(p)
        except psutil.Error:
            continue
    return left


def test_run_nnodes_2_form_b_names_the_node(tmp_path):
    if importlib.util.find_spec("sglang") is None:  # never imported here: it needs its shims
        pytest.skip("real SGLang not installed (python -m hicache_diag.engines.sglang.install)")
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "hicache_diag.cli.main", "run", "--engine", "sglang"]
    cmd += ["--nnodes", "2", "--scenario", str(FORM_B), "--out", str(run_dir), "--json"]
    env = {**os.environ, "HICACHE_DIAG_SGLANG_READY_TIMEOUT": "1200"}
    t0 = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env)
    took = time.monotonic() - t0
    assert done.returncode == 11, f"{took:.0f} s\n{done.stderr[-3000:]}"
    verdict = json.loads(done.stdout)
    assert (verdict["outcome"], verdict["form"], verdict["culprit_rank"]) == ("crash", "B", 1)
    ranks = {r["rank"]: (r["node"], r["pp"], r["tp"]) for r in verdict["ranks"]}
    assert ranks == {0: ("node-0", 0, 0), 1: ("node-1", 1, 0)}
    assert any("node-0: PP0 TP0; node-1: PP1 TP0" in line for line in verdict["evidence"])
    manifest = json.loads((run_dir / "manifest.json").read_text())
    argvs = [n["argv"] for n in manifest["sglang"]["nodes"]]
    assert [a[a.index("--node-rank") + 1] for a in argvs] == ["0", "1"]
    launcher = json.loads((run_dir / "launcher.json").read_text())
    assert sorted(r["node"] for r in launcher["ranks"]) == ["node-0", "node-1"]
    assert not _left_in(run_dir), "a node's server outlived the run"
