"""install_faults: the one call a rank process makes to arm its faults on its Hooks."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from hicache_diag.faults.spec import FaultSpec, parse_fault_spec

if TYPE_CHECKING:
    from hicache_diag.faults.hooks import Hooks

logger = logging.getLogger(__name__)


def install_faults(
    hooks: Hooks,
    specs: Iterable[str | FaultSpec],
    seed: int,
    *,
    rank: int,
    pp_rank: int,
    tp_rank: int,
) -> list[str]:
    """Register the handlers of every spec that targets global `rank`; return their names.

    A spec's index in `specs` enters its schedule's seed, so every rank must pass the run's whole
    list in the same order (the manifest's), not a pre-filtered one.
    """
    installed = []
    for index, spec in enumerate(specs):
        spec = spec if isinstance(spec, FaultSpec) else parse_fault_spec(spec)
        fault = spec.build()
        if not fault.targets(rank):
            continue
        fault.install(hooks, fault.schedule(run_seed=seed, index=index, rank=rank))
        installed.append(spec.name)
    if installed:
        logger.info("faults on PP%d TP%d (rank %d): %s", pp_rank, tp_rank, rank, installed)
    return installed
