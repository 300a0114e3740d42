"""install_faults: rank targeting, string specs, and a package free of torch."""

import json
import os
import subprocess
import sys

import pytest

from hicache_diag.faults import install_faults, parse_fault_spec
from hicache_diag.faults.hooks import Hooks

SPECS = ["dma-delay:rank=1,ms=5", "host-alloc-fail:rank=0|1", "rank-stall:rank=*,ms=1"]


def _install(rank, specs=SPECS, seed=0):
    hooks = Hooks(rank=rank, pp_rank=rank, tp_rank=0)
    return hooks, install_faults(hooks, specs, seed, rank=rank, pp_rank=rank, tp_rank=0)


def test_only_specs_that_target_the_rank_are_installed():
    assert _install(0)[1] == ["host-alloc-fail", "rank-stall"]
    assert _install(1)[1] == ["dma-delay", "host-alloc-fail", "rank-stall"]
    assert _install(2)[1] == ["rank-stall"]
    hooks, _ = _install(0)
    assert hooks.apply("dma_complete", 0.0, direction="write") == 0.0


def test_accepts_fault_specs_and_their_strings_alike():
    specs = [parse_fault_spec(s) for s in SPECS]
    assert _install(1, specs)[1] == _install(1, [s.to_spec() for s in specs])[1]


def test_same_run_seed_same_injections_per_rank():
    def fired(rank, seed):
        hooks, _ = _install(rank, ["host-alloc-fail:p=0.5"], seed)
        return [hooks.apply("host_alloc", True, num_tokens=1) for _ in range(64)]

    assert fired(1, 9) == fired(1, 9)
    assert fired(1, 9) != fired(1, 10)
    assert fired(0, 9) != fired(1, 9)  # ranks draw independently


def test_spec_index_is_part_of_the_seed():
    # Two identical specs must not fire in lockstep: each index has its own stream.
    hooks, _ = _install(1, ["dma-delay:ms=1,p=0.5", "dma-delay:ms=2,p=0.5"])
    delays = {hooks.apply("dma_complete", 0.0, direction="load") for _ in range(64)}
    assert {0.0, 0.001, 0.002, 0.003} <= {round(d, 6) for d in delays}


@pytest.mark.process
def test_importing_faults_does_not_import_torch():
    code = "import sys, hicache_diag.faults; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


_FIRINGS = """
import json, sys
from hicache_diag.faults import install_faults
from hicache_diag.faults.hooks import Hooks
hooks = Hooks(rank=1, pp_rank=1, tp_rank=0)
install_faults(hooks, sys.argv[1:], 42, rank=1, pp_rank=1, tp_rank=0)
for step in range(40):
    hooks.step = step
    hooks.apply("host_alloc", True, num_tokens=4)
    hooks.apply("dma_complete", 0.0, direction="write", num_tokens=4)
print(json.dumps(hooks.drain_fired()))
"""


@pytest.mark.process
def test_rank_processes_draw_the_same_schedule_whatever_their_hash_seed():
    # Rank processes are separate interpreters: the draws must not depend on PYTHONHASHSEED.
    specs = ["host-alloc-fail:p=0.3", "dma-delay:ms=1,jitter-ms=4,p=0.5,seed=3"]
    runs = []
    for hash_seed in ("1", "2"):
        out = subprocess.run(
            [sys.executable, "-c", _FIRINGS, *specs],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
        )
        runs.append(json.loads(out.stdout))
    assert runs[0] == runs[1]
    assert {f["fault"] for f in runs[0]} == {"host-alloc-fail", "dma-delay"}
    assert 0 < len(runs[0]) < 80
