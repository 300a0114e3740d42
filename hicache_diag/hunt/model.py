"""The hunt's records: one per trigger tried, and the report over them (`--json`:
hicache-diag/hunt/v1)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

SCHEMA = "hicache-diag/hunt/v1"


_COUNTS = ("trials", "failures", "undecided")
_NONE = type(None)
# What each key of a hunt.json result holds (from_json refuses anything else: exit 2).
_TYPES: dict[str, type | tuple[type, ...]] = {
    **dict.fromkeys(_COUNTS, int),
    "fault": (str, _NONE),
    "natural": bool,
    "forms": dict,
    "first_failure": (str, _NONE),
    "first_divergence": (dict, _NONE),
    "confirmed": (bool, _NONE),
    "reruns": list,
    "export": (str, _NONE),
    "shrunk": (dict, _NONE),
    "skipped": list,
}


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

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TriggerResult:
        """One entry of hunt.json's `results`; keys an older hunt did not write keep their
        defaults (`reruns`, `shrunk`), derived ones (`divergent`, `via`) are recomputed."""
        if not isinstance(data, dict) or not isinstance(data.get("trigger"), str):
            raise ValueError("a result without a trigger name")
        names = {f.name for f in fields(cls)} - {"name", "what", "sources", "interval"}
        kept = {k: data[k] for k in names if k in data}
        for key, value in kept.items():
            if not isinstance(value, _TYPES[key]) or (isinstance(value, bool) and key in _COUNTS):
                raise ValueError(f"{data['trigger']}: {key} {value!r} is not what the hunt writes")
        interval = data.get("interval") or (0.0, 1.0)
        if not isinstance(data.get("sources", []), list) or len(interval) != 2:
            raise ValueError(f"{data['trigger']}: its sources or interval are malformed")
        return cls(
            data["trigger"],
            str(data.get("what", "")),
            tuple(data.get("sources") or ()),
            interval=(float(interval[0]), float(interval[1])),
            **kept,
        )


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
            "schema": SCHEMA,
            "release": self.release,
            "trials_run": self.trials_run,
            "stopped": self.stopped,
            "divergent": [r.name for r in self.results if r.divergent],
            "results": [r.to_json() for r in self.results],
            "unmapped": list(self.unmapped),
        }

    @classmethod
    def from_json(cls, data: Any) -> HuntReport:
        """hunt.json as `save_report` wrote it (ValueError: not a hunt report)."""
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise ValueError(f"not a hunt report (schema {SCHEMA!r})")
        results = data.get("results")
        if not isinstance(results, list):
            raise ValueError("its results are not a list")
        return cls(
            str(data.get("release", "")),
            [TriggerResult.from_json(r) for r in results],
            list(data.get("unmapped") or ()),
            int(data.get("trials_run") or 0),
            data.get("stopped"),
        )
