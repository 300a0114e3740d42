"""BuiltinOptions -> RunConfig: what only the runtime's model, pools and this host can say,
checked before any rank starts (the options' own checks ran when they were built)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hicache_diag.engines.builtin.options import BuiltinOptions
from hicache_diag.errors import UsageError
from hicache_diag.faults.validate import validated_faults
from hicache_diag.options.parse import from_command_line

if TYPE_CHECKING:
    from hicache_diag.engines.builtin.runtime.protocol import ProtocolConfig
    from hicache_diag.engines.builtin.runtime.server_args import RunConfig, ServerArgs


def _server_args(options: BuiltinOptions) -> ServerArgs:
    from hicache_diag.engines.builtin.runtime.server_args import ServerArgs
    from hicache_diag.evidence.paths import output_dir

    if options.storage and options.hicache_storage_dir:
        output_dir(options.how("hicache_storage_dir"), options.hicache_storage_dir)
        from hicache_diag.options.storage_dir import check_storage_dir

        check_storage_dir(options.hicache_storage_dir, before_start=True)  # exit 2, no rank
    return ServerArgs(
        pp_size=options.pp,
        tp_size=options.tp,
        pp_async_batch_depth=options.async_depth,
        page_size=options.page_size,
        max_total_tokens=options.max_total_tokens,
        hicache_size=options.host_bytes,
        hicache_ratio=options.hicache_ratio,
        hicache_write_policy=options.hicache_write_policy,
        hicache_storage_backend=options.hicache_storage_backend,
        hicache_storage_dir=options.hicache_storage_dir,
        hicache_storage_prefetch_policy=options.hicache_storage_prefetch_policy,
        device="cpu",  # auto is the CPU here; cuda was refused with the options
    )


def _protocol(options: BuiltinOptions) -> ProtocolConfig:
    """A scenario's `fix` list refines the scenario's own preset (e.g. legacy + ack-count=leader
    replays the state between #27285 and #31425); `--protocol` on the command line replaces
    that historical state whole, so it drops the list. `--switch` flags always apply last."""
    from hicache_diag.engines.builtin.runtime.protocol import build_protocol

    scenario_fixes = () if from_command_line(options, "protocol") else options.scenario_fix
    return build_protocol(options.protocol, [*scenario_fixes, *options.switches])


def _refuse_no_effect(protocol: ProtocolConfig, faults: tuple[str, ...]) -> None:
    """Only the builtin tree has a switch for its clock."""
    names = [f.split(":", 1)[0].strip() for f in faults]
    if protocol.lru_clock == "logical" and "clock-skew" in names:
        raise UsageError(
            "fault 'clock-skew' does nothing with lru-clock=logical (the tree stamps a step "
            "counter, not a clock); add --switch lru-clock=monotonic or use --protocol legacy"
        )


def build(options: BuiltinOptions) -> RunConfig:
    """The builtin engine's `build` (engines/registry.py): every check before any rank."""
    from hicache_diag.engines.builtin.host_limits import check_builtin_run
    from hicache_diag.engines.builtin.runtime.server_args import RunConfig
    from hicache_diag.options.workloads import WorkloadConfig, check_fits
    from hicache_diag.trials.rundir import check_writable

    sa = _server_args(options)
    workload = WorkloadConfig(
        options.workload, options.requests, options.max_new_tokens, options.seed
    )
    check_fits(workload, sa, sa.page_size)
    protocol = _protocol(options)
    faults = validated_faults(options)
    _refuse_no_effect(protocol, faults)
    check_writable(options.out)
    cfg = RunConfig(
        sa,
        protocol,
        workload,
        faults,
        options.seed,
        options.out,
        options.hang_timeout,
        options.max_steps,
    )
    check_builtin_run(cfg)  # pools, workload and records against this host's memory and disk
    return cfg


def protocol_switches() -> Mapping[str, Any]:
    """The runtime's protocol switches (`--switch NAME=MODE`), by name."""
    from hicache_diag.engines.builtin.runtime.protocol import SWITCHES

    return SWITCHES
