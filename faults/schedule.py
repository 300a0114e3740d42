"""Seeded injection schedules: which opportunities of one fault on one rank actually fire.

An opportunity is one call of the fault's hook point (a step, an alloc, a DMA completion...).
A schedule fires when the step lies in the `after..until` window (inclusive), the opportunity is
every `every`-th one inside that window (the first one included), and a draw falls under `p`.
The draws come from a `random.Random` derived from the run seed, the spec's `seed` key, the
fault's index in the run and the rank, and are taken in opportunity order, never from wall time,
so the same scenario and seed give the same schedule on every run.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field


def derive_rng(run_seed: int, spec_seed: int, index: int, rank: int, stream: str) -> random.Random:
    # A str seed is hashed with SHA-512 by random.Random, so it is stable across processes and
    # independent of PYTHONHASHSEED; `stream` separates firing draws from magnitude draws.
    return random.Random(f"hicache-diag/fault/{run_seed}/{spec_seed}/{index}/{rank}/{stream}")


@dataclass(slots=True)
class Schedule:
    """Mutable per-(fault, rank) state. `fires(step)` is called once per opportunity, from any
    thread; a lock keeps the opportunity order and the draws consistent."""

    p: float = 1.0
    after: int = 0
    until: int | None = None
    every: int = 1
    run_seed: int = 0
    spec_seed: int = 0
    index: int = 0
    rank: int = 0
    stream: str = ""  # names a fork, for faults with two independent opportunity sequences
    seen: int = field(default=0, init=False)  # in-window opportunities so far
    _fire_rng: random.Random = field(init=False, repr=False)
    _value_rng: random.Random = field(init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        ids = (self.run_seed, self.spec_seed, self.index, self.rank)
        self._fire_rng = derive_rng(*ids, f"{self.stream}fire")
        self._value_rng = derive_rng(*ids, f"{self.stream}value")

    def in_window(self, step: int) -> bool:
        return step >= self.after and (self.until is None or step <= self.until)

    def fires(self, step: int) -> bool:
        if not self.in_window(step):
            return False
        with self._lock:
            k, self.seen = self.seen, self.seen + 1
            if k % self.every:
                return False
            return self._fire_rng.random() < self.p

    def uniform(self, lo: float, hi: float) -> float:
        """A seeded magnitude (jitter), drawn from its own stream so that changing a magnitude key
        never shifts which opportunities fire."""
        if hi <= lo:
            return lo
        with self._lock:
            return self._value_rng.uniform(lo, hi)

    def chance(self, p: float) -> bool:
        """A seeded yes/no with probability `p`, from the magnitude stream."""
        return p > 0 and self.uniform(0.0, 1.0) < p

    def fork(self, stream: str) -> Schedule:
        """Same keys, a fresh counter and draws of its own (e.g. lookups vs reads)."""
        return self._copy(f"{self.stream}{stream}/")

    def fresh(self) -> Schedule:
        return self._copy(self.stream)

    def _copy(self, stream: str) -> Schedule:
        return Schedule(
            self.p,
            self.after,
            self.until,
            self.every,
            self.run_seed,
            self.spec_seed,
            self.index,
            self.rank,
            stream,
        )

    def preview(self, steps: Iterable[int]) -> list[int]:
        """Pure: the steps that would fire for this opportunity sequence, on a fresh copy."""
        probe = self.fresh()
        return [s for s in steps if probe.fires(s)]
