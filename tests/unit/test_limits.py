"""limits.py: every refusal names the largest value that fits, and that value does fit."""

from __future__ import annotations

import re

import pytest

from hicache_diag.engines.builtin.host_limits import check_builtin_run
from hicache_diag.engines.builtin.runtime.server_args import (
    RunConfig,
    ServerArgs,
    WorkloadConfig,
    auto_step_budget,
)
from hicache_diag.errors import UsageError
from hicache_diag.options.limits import Machine, check_jobs, check_pools, check_seconds

SMALL = Machine(memory_available=2 * 1024**3, cpus=2)


def _largest(exc: pytest.ExceptionInfo) -> int:
    return int(re.search(r"largest \S+ ?(?:that fits )?is (\d+)", str(exc.value)).group(1))


def _cfg(tokens: int, **wl) -> RunConfig:
    sa = ServerArgs(max_total_tokens=tokens, page_size=4)
    return RunConfig(sa, workload=WorkloadConfig(**wl))


def test_the_largest_pool_named_fits_and_one_page_more_does_not():
    with pytest.raises(UsageError) as exc:
        check_builtin_run(_cfg(10**12), SMALL)
    largest = _largest(exc)
    assert 256 < largest < 10**12
    check_builtin_run(_cfg(largest // 4 * 4), SMALL)  # page aligned, at the bound: accepted
    with pytest.raises(UsageError):
        check_builtin_run(_cfg(largest * 2), SMALL)


def test_pools_of_every_rank_count():
    one = [1536]
    check_pools(one, 1000, [2000], SMALL)
    with pytest.raises(UsageError, match="across 8 rank"):
        check_pools(one * 8, 10**8, [2 * 10**8] * 8, SMALL)


def test_jobs_scale_with_the_ranks_per_trial():
    check_jobs(2, 2, SMALL)
    with pytest.raises(UsageError, match="--jobs must be between 1 and"):
        check_jobs(100, 4, SMALL)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0, 0.0, 86_401.0])
def test_seconds_out_of_range(value):
    with pytest.raises(UsageError, match="one day"):
        check_seconds("--hang-timeout", value)


def test_auto_budget_grows_with_requests_and_the_loop():
    base = auto_step_budget(ServerArgs(), WorkloadConfig(requests=32))
    assert auto_step_budget(ServerArgs(), WorkloadConfig(requests=400)) > base
    assert auto_step_budget(ServerArgs(pp_async_batch_depth=8), WorkloadConfig(requests=32)) > base
    # --requests 400 at the defaults took 2466 steps: the old hidden cap was 2000
    assert auto_step_budget(ServerArgs(), WorkloadConfig(requests=400)) > 2466
