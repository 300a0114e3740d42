"""Run inputs that would do nothing, or contradict each other, refused before anything starts:
one table of rules over the run options (both engines), each a one-line reason. A rule sees the
options as built and `given`, how the user wrote each one, so it names what was written."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from hicache_diag.errors import UsageError

if TYPE_CHECKING:
    from hicache_diag.faults.base import Fault


class RunOptions(Protocol):
    """What the rules read of the run options (run_options.py, the layer above, calls them)."""

    given: Mapping[str, str]
    faults: tuple[str, ...]
    pp: int
    tp: int
    hicache_storage_dir: str | None

    @property
    def host_bytes(self) -> int: ...
    @property
    def storage(self) -> bool: ...
    def how(self, name: str) -> str: ...


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
    for name, fault in _faults(o):  # (a window that never opens: faults/schedule.py refuses)
        if fault.p == 0:
            return f"fault {name!r} never fires: p=0"
    return None


def _contradicting_fixes(o: RunOptions) -> str | None:
    seen: dict[str, str] = {}
    for item in getattr(o, "fix", ()):
        switch, _, mode = item.partition("=")
        if switch in seen and seen[switch] != mode:
            return (
                f"--fix {switch}={seen[switch]} and --fix {switch}={mode} contradict; give the "
                "switch once"
            )
        seen[switch] = mode
    return None


def _idle_nodes(o: RunOptions) -> str | None:
    nnodes, ranks = getattr(o, "nnodes", 1), o.pp * o.tp
    if nnodes > ranks:
        return (
            f"{o.how('nnodes')} {nnodes} is more nodes than ranks ({ranks}: --pp {o.pp} x "
            f"--tp {o.tp}): a node would run nothing"
        )
    return None


RULES: tuple[Rule, ...] = (
    Rule("size-and-ratio", _size_and_ratio),
    Rule("storage-options-without-storage", _storage_options),
    Rule("fault-without-its-mechanism", _fault_needs),
    Rule("fault-that-never-fires", _fault_never_fires),
    Rule("contradicting-fixes", _contradicting_fixes),
    Rule("nodes-without-ranks", _idle_nodes),
)


def refuse_no_effect(options: RunOptions) -> None:
    """The first rule the options break, as a UsageError (exit 2)."""
    for rule in RULES:
        why = rule.reason(options)
        if why:
            raise UsageError(why)
