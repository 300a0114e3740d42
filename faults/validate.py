"""A run's faults checked for its engine and topology before anything starts (both engines)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hicache_diag.errors import UsageError
from hicache_diag.faults.spec import validate_faults

if TYPE_CHECKING:
    from hicache_diag.run_options import RunOptions


def validated_faults(options: RunOptions) -> tuple[str, ...]:
    """The options' fault specs, parsed, checked against the topology and refused where the
    engine lacks the fault's mechanism (SGLang's, per release, at its probe); canonical text."""
    if not options.faults:
        return ()
    checked = validate_faults(options.faults, options.pp, options.tp)
    for spec in checked:
        why = spec.build().refusal(options.engine)
        if why:
            raise UsageError(f"fault {spec.name!r} cannot run on --engine {options.engine}: {why}")
    return tuple(f.to_spec() for f in checked)
