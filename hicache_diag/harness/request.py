"""One run request: the command line over the scenario file, parsed once, before any engine's
defaults. Each engine turns it into its own config (`build(request)`, harness/engine.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class RunRequest:
    """`flags`: the command line (None: not given). `scenario`: the scenario's run options
    (storage aliases mapped, types checked), `scenario_faults` its fault specs."""

    flags: Mapping[str, Any] = field(default_factory=dict)
    scenario: Mapping[str, Any] = field(default_factory=dict)
    scenario_faults: tuple[str, ...] = ()

    def given(self, name: str) -> Any:
        """Command line, then scenario file; None where neither says."""
        if self.flags.get(name) is not None:
            return self.flags[name]
        return self.scenario.get(name)

    def value(self, name: str, defaults: Mapping[str, Any]) -> Any:
        """What the user gave, else the engine's default."""
        got = self.given(name)
        return got if got is not None else defaults.get(name)

    @property
    def engine(self) -> str:
        return self.given("engine") or "builtin"

    @property
    def faults(self) -> tuple[str, ...]:
        """The scenario's faults, then the command line's (both apply)."""
        return self.scenario_faults + tuple(self.flags.get("fault") or ())

    def given_all(self) -> dict[str, Any]:
        """Every option either source set (the no-effect check reads what was asked for)."""
        return {k: v for k, v in {**self.scenario, **self.flags}.items() if v is not None}
