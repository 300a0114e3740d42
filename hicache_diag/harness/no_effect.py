"""Flag combinations that would do nothing, refused before anything starts (README: "flag
combinations that do nothing ... one line, exit 2"). Both engines call `refuse_no_effect`; the
builtin engine adds the clock rule, since only it has a protocol switch for the tree's clock."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from hicache_diag.errors import UsageError

# Faults that act only at the L3 storage hook points (faults/*.py POINTS).
L3_FAULTS = ("l3-partial-hit", "prefetch-alloc-fail")
_NO_L3 = "does nothing without --hicache-storage-backend file"


def _fault_name(spec: str) -> str:
    return spec.split(":", 1)[0].strip()


def refuse_no_effect(
    given: Mapping[str, Any],
    faults: Iterable[str],
    storage: bool,
    lru_clock: str | None = None,
) -> None:
    """`given`: the run options the user set (command line or scenario), by snake_case name;
    `faults`: the fault specs; `storage`: an L3 backend is on; `lru_clock`: the builtin tree's
    clock switch (None for an engine without one)."""
    size = given.get("hicache_size")
    if size not in (None, 0, "0") and given.get("hicache_ratio") is not None:
        raise UsageError(
            "--hicache-size and --hicache-ratio both set: a size fixes the host pool and the "
            "ratio does nothing; give one of them"
        )
    if not storage and given.get("hicache_storage_prefetch_policy") is not None:
        raise UsageError(f"--hicache-storage-prefetch-policy {_NO_L3}")
    names = [_fault_name(f) for f in faults]
    for name in names:
        if not storage and name in L3_FAULTS:
            raise UsageError(f"fault {name!r} acts on L3 storage and {_NO_L3}")
    if lru_clock == "logical" and "clock-skew" in names:
        raise UsageError(
            "fault 'clock-skew' does nothing with lru-clock=logical (the tree stamps a step "
            "counter, not a clock); add --fix lru-clock=monotonic or use --protocol legacy"
        )

