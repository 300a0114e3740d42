"""The fault spec grammar `NAME[:key=value[,key=value...]]`, and validation against a topology.

Specs travel to rank processes as strings, so `FaultSpec.to_spec()` round-trips through
`parse_fault_spec`. Every check raises `UsageError` with one line that names the valid choices.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass

from hicache_diag.errors import UsageError
from hicache_diag.faults.base import Fault
from hicache_diag.faults.registry import FAULTS

GRAMMAR = "NAME[:key=value[,key=value...]]"
# Every fault installs hooks that every rank runs at each opportunity (a step, an alloc, a DMA);
# a list longer than this is generated, not a scenario, and would slow every step it touches.
MAX_FAULTS = 64


def check_fault_count(count: int, where: str = "a run") -> None:
    if count > MAX_FAULTS:
        raise UsageError(
            f"{count} faults in {where}; the most is {MAX_FAULTS} per run "
            "(a fault with several ranks or a wider step window covers more)"
        )


@dataclass(frozen=True, slots=True)
class FaultSpec:
    """A validated fault spec: its name and its keys as text, in the order given."""

    name: str
    params: tuple[tuple[str, str], ...] = ()

    def build(self) -> Fault:
        """The typed keys (a frozen `Fault` subclass); raises UsageError on any bad key."""
        return FAULTS[self.name].from_params(dict(self.params))

    def to_spec(self) -> str:
        if not self.params:
            return self.name
        return f"{self.name}:" + ",".join(f"{k}={v}" for k, v in self.params)

    def targets(self, rank: int) -> bool:
        return self.build().targets(rank)

    def __str__(self) -> str:
        return self.to_spec()


def _fault_name(name: str) -> str:
    name = name.strip().lower().replace("_", "-")
    if name in FAULTS:
        return name
    close = difflib.get_close_matches(name, list(FAULTS), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise UsageError(f"unknown fault {name!r}{hint}; valid: {', '.join(FAULTS)}")


def make_fault_spec(name: str, params: Iterable[tuple[str, str]] = ()) -> FaultSpec:
    """Normalize (kebab-case names and keys, stripped values) and validate one spec."""
    name = _fault_name(name)
    seen: dict[str, str] = {}
    for key, value in params:
        key = key.strip().lower().replace("_", "-")
        if key in seen:
            raise UsageError(f"fault {name!r}: key {key!r} given twice")
        seen[key] = value.strip()
    spec = FaultSpec(name, tuple(seen.items()))
    spec.build()  # validates every key and value
    return spec


def parse_fault_spec(text: str) -> FaultSpec:
    """Parse one `--fault` value, e.g. `dma-delay:rank=1,ms=40,dir=write`."""
    name, sep, rest = text.strip().partition(":")
    if not name.strip() or (sep and not rest.strip()):
        raise UsageError(f"malformed fault spec {text!r}; expected {GRAMMAR}")
    params = []
    for item in rest.split(",") if sep else []:
        key, eq, value = item.partition("=")
        if not eq or not key.strip() or not value.strip():
            raise UsageError(
                f"malformed fault spec {text!r}: {item.strip()!r} is not key=value; "
                f"expected {GRAMMAR}"
            )
        params.append((key, value))
    return make_fault_spec(name, params)


def _check_topology(spec: FaultSpec, pp_size: int, tp_size: int) -> None:
    ranks = spec.build().rank
    world = pp_size * tp_size
    outside = [r for r in ranks or () if r >= world]
    if outside:
        valid = ", ".join(str(r) for r in range(world))
        raise UsageError(
            f"fault {spec.name!r}: rank {outside[0]} is outside the topology "
            f"(pp={pp_size} x tp={tp_size}, rank = pp_rank*tp_size + tp_rank); valid: {valid} or *"
        )


def validate_faults(
    specs: Iterable[str | FaultSpec], pp_size: int, tp_size: int
) -> list[FaultSpec]:
    """Parse and check every spec against the topology before any process starts."""
    specs = list(specs)
    check_fault_count(len(specs))
    checked = []
    for spec in specs:
        if isinstance(spec, FaultSpec):  # built by hand, perhaps: check it like text
            spec = make_fault_spec(spec.name, spec.params)
        else:
            spec = parse_fault_spec(spec)
        _check_topology(spec, pp_size, tp_size)
        checked.append(spec)
    return checked
