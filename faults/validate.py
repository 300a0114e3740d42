"""A run's faults checked for its engine and topology before anything starts (both engines)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from hicache_diag.errors import UsageError
from hicache_diag.faults.spec import validate_faults

if TYPE_CHECKING:
    from hicache_diag.faults.base import Fault


class _Run(Protocol):
    """What this needs of the run options (hicache_diag/options/run_options.py, a layer above)."""

    engine: str
    faults: tuple[str, ...]
    pp: int
    tp: int

    def fault_refusal(self, fault: type[Fault]) -> str | None: ...


def validated_faults(options: _Run) -> tuple[str, ...]:
    """The options' fault specs, parsed, checked against the topology and refused where the
    engine lacks the fault's mechanism (SGLang's, per release, at its probe); canonical text."""
    if not options.faults:
        return ()
    checked = validate_faults(options.faults, options.pp, options.tp)
    for spec in checked:
        why = options.fault_refusal(type(spec.build()))
        if why:
            raise UsageError(f"fault {spec.name!r} cannot run on --engine {options.engine}: {why}")
    return tuple(f.to_spec() for f in checked)
