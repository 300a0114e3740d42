"""The hunt's records: one per trigger tried, and the report over them (`--json`:
hicache-diag/hunt/v1)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class TriggerResult:
    """What one trigger did: its variant run (a fault when natural was not enough), the
    trials and failures, the 95% Wilson interval, the first failing run and its evidence."""

    name: str
    what: str
    sources: tuple[str, ...]
    fault: str | None = None
    natural: bool = True
    trials: int = 0
    failures: int = 0
    undecided: int = 0
    forms: dict[str, int] = field(default_factory=dict)
    interval: tuple[float, float] = (0.0, 1.0)
    first_failure: str | None = None  # its run dir
    first_divergence: dict[str, Any] | None = None
    confirmed: bool | None = None  # a fresh rerun of the failing seed failed again (None: no
    # rerun, or every rerun undecided)
    reruns: list[str] = field(default_factory=list)  # each confirming rerun's outcome
    export: str | None = None  # the export's dir, or why there is none
    shrunk: dict[str, Any] | None = None  # {removed, run}: the shrunk failure that was exported
    skipped: list[str] = field(default_factory=list)  # variants not run, with why

    @property
    def divergent(self) -> bool:
        return bool(self.failures) and self.confirmed is True

    @property
    def via(self) -> str | None:
        """The divergence source the first failing run's verdict names (its first divergence):
        what really parted the ranks, which need not be the reads this trigger aims at."""
        return (self.first_divergence or {}).get("source")

    def to_json(self) -> dict[str, Any]:
        return {
            "trigger": self.name,
            "what": self.what,
            "sources": list(self.sources),
            "fault": self.fault,
            "natural": self.natural,
            "trials": self.trials,
            "failures": self.failures,
            "undecided": self.undecided,
            "forms": dict(self.forms),
            "interval": list(self.interval),
            "first_failure": self.first_failure,
            "first_divergence": self.first_divergence,
            "confirmed": self.confirmed,
            "reruns": list(self.reruns),
            "divergent": self.divergent,
            "via": self.via,
            "export": self.export,
            "shrunk": self.shrunk,
            "skipped": list(self.skipped),
        }


@dataclass(slots=True)
class HuntReport:
    release: str
    results: list[TriggerResult] = field(default_factory=list)
    unmapped: list[str] = field(default_factory=list)
    trials_run: int = 0
    stopped: str | None = None  # "budget" | "interrupted" | None (every trigger tried)

    @property
    def interrupted(self) -> bool:
        return self.stopped == "interrupted"

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": "hicache-diag/hunt/v1",
            "release": self.release,
            "trials_run": self.trials_run,
            "stopped": self.stopped,
            "divergent": [r.name for r in self.results if r.divergent],
            "results": [r.to_json() for r in self.results],
            "unmapped": list(self.unmapped),
        }
