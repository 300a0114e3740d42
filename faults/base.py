"""The Fault base: a frozen dataclass of a fault's keys, parsed from spec text, plus install()."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar

from hicache_diag.errors import UsageError
from hicache_diag.faults import keys as K
from hicache_diag.faults.schedule import Schedule

if TYPE_CHECKING:  # the runtime's Hooks; imported lazily so validation stays light
    from hicache_diag.faults.hooks import Hooks

COMMON_KEYS = ("rank", "p", "after", "until", "seed")


def key_name(field_name: str) -> str:
    """Dataclass field -> spec key: `jitter_ms` -> `jitter-ms` (CLI names are kebab-case)."""
    return field_name.replace("_", "-")


@dataclass(frozen=True, slots=True)
class Fault:
    """One injector's keys. Subclasses add their own keys with `keys.key(...)` and implement
    `install`, which registers handlers on hook points and calls `hooks.record` only when a
    handler really perturbs a value. Handlers may run on the scheduler, DMA or storage threads."""

    NAME: ClassVar[str] = ""
    POINTS: ClassVar[tuple[str, ...]] = ()
    SUMMARY: ClassVar[str] = ""
    # A spec must set at least one of these, so that no fault silently does nothing.
    EFFECT_KEYS: ClassVar[tuple[str, ...]] = ()
    # What `run --list-faults` and docs/faults.md say of it (one home: faults/catalog.py reads
    # these): the physical event it stands for, when production meets it, the SGLang function
    # it acts in per release ((releases, function) pairs), what it cannot model, and whether
    # it can make a state SGLang cannot reach ("" = it cannot; else why it can).
    EVENT: ClassVar[str] = ""
    WHEN: ClassVar[str] = ""
    ACTS_IN: ClassVar[tuple[tuple[str, str], ...]] = ()
    CANNOT: ClassVar[str] = ""
    UNREACHABLE: ClassVar[str] = ""
    # Why the builtin runtime cannot run this fault (it lacks the mechanism); "" = it can. Each
    # engine's options ask for their own refusal (RunOptions.fault_refusal).
    BUILTIN_REFUSAL: ClassVar[str] = ""

    rank: tuple[int, ...] | None = K.key(
        None, K.ranks, "global rank(s) pp_rank*tp_size+tp_rank: 1, 1|2 or * (default *)"
    )
    p: float = K.key(1.0, K.probability, "probability per opportunity (default 1)")
    after: int = K.key(0, K.step, "first step of the window, inclusive (default 0)")
    until: int | None = K.key(None, K.step, "last step of the window, inclusive (default: none)")
    seed: int = K.key(0, K.seed, "mixed with the run seed into this fault's draws (default 0)")

    @classmethod
    def key_names(cls) -> tuple[str, ...]:
        return tuple(key_name(f.name) for f in fields(cls))

    @classmethod
    def key_docs(cls) -> dict[str, str]:
        return {key_name(f.name): f.metadata["doc"] for f in fields(cls)}

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> Fault:
        """Parse spec text into the typed keys; one-line UsageError naming the valid choices."""
        by_key = {key_name(f.name): f for f in fields(cls)}
        values: dict[str, Any] = {}
        for name, text in params.items():
            f = by_key.get(name)
            if f is None:
                raise UsageError(
                    f"fault {cls.NAME!r}: unknown key {name!r}; valid: {', '.join(by_key)}"
                )
            try:
                values[f.name] = f.metadata["parse"](text)
            except ValueError as exc:
                raise UsageError(
                    f"fault {cls.NAME!r}: bad value {text!r} for key {name!r}; expected {exc}"
                ) from None
        fault = cls(**values)
        fault.check(set(params))
        return fault

    def check(self, given: set[str]) -> None:
        if self.until is not None and self.until < self.after:
            raise UsageError(
                f"fault {self.NAME!r}: until={self.until} is before after={self.after}; "
                "the step window needs until >= after"
            )
        if self.EFFECT_KEYS and not given & set(self.EFFECT_KEYS):
            raise UsageError(
                f"fault {self.NAME!r} does nothing without one of: {', '.join(self.EFFECT_KEYS)}"
            )

    @classmethod
    def sglang_refusal(cls, version: str | None = None) -> str | None:
        """Why SGLang release `version` cannot run this fault (it lacks the mechanism), or
        None. One line, shown with exit 2 before anything starts."""
        return None

    def targets(self, rank: int) -> bool:
        return self.rank is None or rank in self.rank

    def schedule(self, *, run_seed: int, index: int, rank: int) -> Schedule:
        """The seeded schedule of spec number `index` of a run on global `rank`."""
        every = getattr(self, "every", 1)  # only faults that expose `every` have it
        return Schedule(self.p, self.after, self.until, every, run_seed, self.seed, index, rank)

    def install(self, hooks: Hooks, schedule: Schedule) -> None:
        raise NotImplementedError
