"""The builtin engine's run options: the common ones (options/run_options.py) plus its protocol
switches and its step budget, each declared once with its flag; and the refusals only this
engine's options can state."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from hicache_diag.errors import UsageError
from hicache_diag.options.limits import check_int
from hicache_diag.options.params import Param, option
from hicache_diag.options.run_options import SGLANG_WORKLOADS, RunOptions

if TYPE_CHECKING:
    from hicache_diag.faults.base import Fault

MAX_STEPS_DEFAULT = "auto: 25 x requests + 2 x requests x (max-new-tokens + 1) x loop size + 1000"


@dataclass(frozen=True, slots=True)
class BuiltinOptions(RunOptions):
    """Our compact runtime: its protocol switches and its step budget."""

    engine: ClassVar[str] = "builtin"
    summary: ClassVar[str] = "our compact runtime"
    trial_timeout_s: ClassVar[float] = 300.0  # a bisect trial: ranks start in about a second

    protocol: str = option(
        "full", Param("--protocol", "Switch preset: legacy, l2, full.", "PRESET")
    )
    # --switch NAME=MODE, applied last (after the preset and the scenario's `fix` list)
    switches: tuple[str, ...] = option(
        (),
        Param(
            "--switch",
            "Set one protocol switch; repeatable.",
            "NAME=MODE",
            deprecated=("--fix",),
        ),
        scenario=False,
    )
    # the scenario's `fix` list (refines its preset)
    scenario_fix: tuple[str, ...] = option((), None, scenario_key="fix")
    # None: automatic (runtime/server_args.auto_step_budget)
    max_steps: int | None = option(
        None,
        Param(
            "--max-steps",
            "Step budget: PP0 stops after N steps; running out is undecided (exit 3), never a "
            "verdict.",
            "N",
            default_text=MAX_STEPS_DEFAULT,
        ),
    )

    def __post_init__(self) -> None:
        RunOptions.__post_init__(self)
        if self.workload in SGLANG_WORKLOADS:
            raise UsageError(
                f"--workload {self.workload} drives SGLang's sessions or /flush_cache over HTTP, "
                "which the builtin runtime does not have; use --engine sglang"
            )
        if self.max_steps is not None:
            check_int(self.how("max_steps"), self.max_steps, 1)
        if self.device == "cuda":
            raise UsageError(
                f"{self.how('device')} cuda: the builtin engine runs on the CPU only (its tiny "
                "model, KV pools and gloo transport); use --engine sglang for a GPU"
            )
        why = self._contradicting_switches() or self._fault_past_budget()
        if why:
            raise UsageError(why)

    @classmethod
    def fault_refusal(cls, fault: type[Fault]) -> str | None:
        return fault.BUILTIN_REFUSAL or None

    def _contradicting_switches(self) -> str | None:
        seen: dict[str, str] = {}
        flag = self.how("switches")
        for item in self.switches:
            switch, _, mode = item.partition("=")
            if switch in seen and seen[switch] != mode:
                return (
                    f"{flag} {switch}={seen[switch]} and {flag} {switch}={mode} contradict; give "
                    "the switch once"
                )
            seen[switch] = mode
        return None

    def _fault_past_budget(self) -> str | None:
        from hicache_diag.faults import parse_fault_spec

        if self.max_steps is None:
            return None
        for spec in self.faults:  # (until < after: faults/base.py refuses)
            parsed = parse_fault_spec(spec)
            after = parsed.build().after
            if after > self.max_steps:
                return (
                    f"fault {parsed.name!r} never fires: its window opens at after={after}, "
                    f"past {self.how('max_steps')} {self.max_steps}"
                )
        return None
