"""A builtin run against this host: every rank's pools, the workload and the recorded steps
(the limits themselves are hicache_diag/options/limits.py's)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hicache_diag.errors import UsageError
from hicache_diag.options.limits import (
    RECORD_BYTES_PER_STEP,
    Machine,
    check_pools,
    check_record_disk,
    check_requests,
    disk_free,
)

if TYPE_CHECKING:
    from hicache_diag.engines.builtin.runtime.server_args import RunConfig


def check_builtin_run(cfg: RunConfig, machine: Machine | None = None) -> None:
    """Everything a builtin run holds, against this host: pools, workload, recorded steps."""
    from hicache_diag.engines.builtin.runtime.server_args import (
        AUTO_STEP_SLACK,
        auto_steps_per_request,
    )
    from hicache_diag.options.workloads import prompt_limit

    sa, wl = cfg.server_args, cfg.workload
    machine = machine or Machine.here()
    ranks = [(p, t) for p in range(sa.pp_size) for t in range(sa.tp_size)]
    token_bytes = [sa.kv_bytes_per_token(p) for p, _ in ranks]
    host = [sa.host_token_capacity(p) for p, _ in ranks]
    check_pools(token_bytes, sa.max_total_tokens, host, machine)
    check_requests(
        wl.requests, prompt_limit(wl, sa) + wl.max_new_tokens, sa.world_size + 1, machine
    )
    # The budget bounds what a run can record; an automatic one grows with --requests.
    if cfg.max_steps is not None:
        check_record_disk(cfg.max_steps, sa.world_size, cfg.out, "--max-steps")
        return
    free_steps = disk_free(cfg.out or "runs") // (RECORD_BYTES_PER_STEP * sa.world_size)
    if cfg.step_budget > free_steps:
        per_request = auto_steps_per_request(sa, wl)
        largest = max(0, (free_steps - AUTO_STEP_SLACK) // per_request)
        raise UsageError(
            f"--requests {wl.requests} may record up to {cfg.step_budget} steps (its automatic "
            f"--max-steps) x {sa.world_size} rank(s), more than the disk under "
            f"{cfg.out or 'runs/'} holds; the largest --requests that fits is {largest} "
            "(or set --max-steps)"
        )
