"""Fault injection (installed as hicache_diag.faults): registry, spec grammar, scenarios, injectors.

The runtime never imports a concrete fault: a rank process calls `install_faults`, which registers
handlers on the named points of `hicache_diag.faults.hooks.Hooks`. No torch here, so the CLI can
validate specs before any process starts.
"""

from hicache_diag.faults.base import COMMON_KEYS, Fault
from hicache_diag.faults.install import install_faults
from hicache_diag.faults.registry import FAULTS
from hicache_diag.faults.scenario import Scenario, load_scenario
from hicache_diag.faults.schedule import Schedule
from hicache_diag.faults.spec import GRAMMAR, FaultSpec, parse_fault_spec, validate_faults

__all__ = [
    "COMMON_KEYS",
    "FAULTS",
    "GRAMMAR",
    "Fault",
    "FaultSpec",
    "Scenario",
    "Schedule",
    "install_faults",
    "load_scenario",
    "parse_fault_spec",
    "validate_faults",
]
