"""Run inputs that would do nothing, or contradict each other, refused before anything starts:
RULES over the common run options (every engine; `run` and the run flags of bisect, hunt and
shrink), each a one-line reason naming what was written. The parser applies them to what the
user gave, and the registry's `build` to every variant made from it (a bisect cell, a hunt
trigger, a shrink candidate). An engine's own such rules are its options class's
(engines/*/options.py); a command's rules over its own flags sit beside the command (cli/)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hicache_diag.errors import UsageError
from hicache_diag.options.run_options import RunOptions

if TYPE_CHECKING:
    from hicache_diag.faults.base import Fault


NO_L3 = "does nothing without --hicache-storage-backend file"
L3_FAULTS = ("l3-partial-hit", "prefetch-alloc-fail")  # act only at the L3 storage hook points
PP_FAULTS = ("p2p-delay",)  # act only on the PP sends between stages


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    reason: Callable[[RunOptions], str | None]


def _size_and_ratio(o: RunOptions) -> str | None:
    if o.host_bytes and "hicache_ratio" in o.given:
        return (
            "--hicache-size and --hicache-ratio both set: a size fixes the host pool and the "
            "ratio does nothing; give one of them"
        )
    return None


def _storage_options(o: RunOptions) -> str | None:
    if o.storage:
        return None
    if o.hicache_storage_dir:
        return f"{o.how('hicache_storage_dir')} {NO_L3}"
    if "hicache_storage_prefetch_policy" in o.given:
        return f"{o.how('hicache_storage_prefetch_policy')} {NO_L3}"
    return None


def _faults(o: RunOptions) -> Iterator[tuple[str, Fault]]:
    from hicache_diag.faults import parse_fault_spec

    for spec in o.faults:
        parsed = parse_fault_spec(spec)
        yield parsed.name, parsed.build()


def _fault_needs(o: RunOptions) -> str | None:
    for name, _ in _faults(o):
        if name in L3_FAULTS and not o.storage:
            return f"fault {name!r} acts on L3 storage and {NO_L3}"
        if name in PP_FAULTS and o.pp < 2:
            return f"fault {name!r} delays the sends between PP stages and does nothing with --pp 1"
    return None


def _fault_never_fires(o: RunOptions) -> str | None:
    for name, fault in _faults(o):  # (a window past the step budget: the engine's own rule)
        if fault.p == 0:
            return f"fault {name!r} never fires: p=0"
    return None


# Effect keys whose 0 is no effect (`leave=0`, a pool left empty, is the strongest shortage).
ZERO_IS_NONE = ("ms", "jitter-ms", "offset-ms", "drift-ppm", "jitter-us", "phase-ms", "hold")


def _fault_of_zero_size(o: RunOptions) -> str | None:
    """A fault whose every effect key is 0 or unset (a stall of 0 ms) fires and changes
    nothing."""
    for name, fault in _faults(o):
        keys = type(fault).EFFECT_KEYS
        values = {k: getattr(fault, k.replace("-", "_"), None) for k in keys}
        if keys and all(v is None or (k in ZERO_IS_NONE and v == 0) for k, v in values.items()):
            zero = ",".join(f"{k}={v:g}" for k, v in values.items() if v is not None)
            return f"fault {name!r} does nothing: {zero} (give one of {', '.join(keys)} > 0)"
    return None


RULES: tuple[Rule, ...] = (
    Rule("size-and-ratio", _size_and_ratio),
    Rule("storage-options-without-storage", _storage_options),
    Rule("fault-without-its-mechanism", _fault_needs),
    Rule("fault-that-never-fires", _fault_never_fires),
    Rule("fault-of-zero-size", _fault_of_zero_size),
)


def refuse_no_effect(options: RunOptions) -> RunOptions:
    """`options`, or the first rule they break as a UsageError (exit 2)."""
    for rule in RULES:
        why = rule.reason(options)
        if why:
            raise UsageError(why)
    return options
