"""SGLang's own HiCache test injectors (`SGLANG_TEST_HICACHE_*`, 0.5.23+), as named faults.

They pass through: the plugin sets the variable in the targeted rank's scheduler process before
SGLang reads it (`envs.X.get()` reads the environment at each call), and SGLang injects. The
builtin engine has no such injector and refuses them; so does a release without the variable,
and one whose injector needs a GPU (`torch.cuda._sleep`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from hicache_diag.faults import keys as K
from hicache_diag.faults.base import Fault

if TYPE_CHECKING:
    from hicache_diag.faults.hooks import Hooks
    from hicache_diag.faults.schedule import Schedule

SINCE = (0, 5, 23)  # the first release whose environ.py defines SGLANG_TEST_HICACHE_*


def _release(version: str | None) -> tuple[int, ...]:
    parts = []
    for part in (version or "0").split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


_NO_INJECTOR = "it is SGLang's own injector; the builtin engine has no such mechanism"


def _not_in(version: str | None) -> str | None:
    if _release(version) < SINCE:
        return f"sglang {version} has no SGLANG_TEST_HICACHE_* injectors (0.5.23 added them)"
    return None


@dataclass(frozen=True, slots=True)
class SglangStorageInjector(Fault):
    NAME: ClassVar[str] = "sglang-storage-injector"
    SUMMARY: ClassVar[str] = "SGLang's random L3 backend failures and delays, on one rank"
    EFFECT_KEYS: ClassVar[tuple[str, ...]] = ("delay-s", "failure")
    EVENT: ClassVar[str] = (
        "an unreliable L3 backend on one rank: each storage call may fail or be delayed "
        "(SGLang's HiCacheStorageFailureInjector, drawn per rank and thread)"
    )
    WHEN: ClassVar[str] = "remote storage timeouts, a flaky storage node, network partitions"
    ACTS_IN: ClassVar[tuple[tuple[str, str], ...]] = (
        (
            "0.5.23+",
            "hicache_storage._maybe_wrap_hicache_storage_failure_injector (env "
            "SGLANG_TEST_HICACHE_BACKEND_RANDOM_FAILURE / _RANDOM_DELAY)",
        ),
        ("builtin", "refused: no such injector"),
    )
    CANNOT: ClassVar[str] = (
        "a seeded schedule: SGLang draws from its own per-thread random, so runs differ; a "
        "step window (the backend is wrapped once, at start-up)"
    )
    BUILTIN_REFUSAL: ClassVar[str] = _NO_INJECTOR

    failure: float = K.key(0.0, K.probability, "probability that a storage call fails")
    delay_s: float = K.key(0.0, K.seconds, "upper bound of a random delay per storage call (s)")

    @classmethod
    def sglang_refusal(cls, version: str | None = None) -> str | None:
        return _not_in(version)

    def install(self, hooks: Hooks, schedule: Schedule) -> None:
        if self.failure:
            os.environ["SGLANG_TEST_HICACHE_BACKEND_RANDOM_FAILURE"] = repr(self.failure)
        if self.delay_s:
            os.environ["SGLANG_TEST_HICACHE_BACKEND_RANDOM_DELAY"] = repr(self.delay_s)
        hooks.record(self.NAME, failure=self.failure, delay_s=self.delay_s)


@dataclass(frozen=True, slots=True)
class SglangH2dDelay(Fault):
    NAME: ClassVar[str] = "sglang-h2d-delay"
    SUMMARY: ClassVar[str] = "SGLang's H2D copy delay (GPU sleep cycles per layer), one rank"
    EFFECT_KEYS: ClassVar[tuple[str, ...]] = ("cycles",)
    EVENT: ClassVar[str] = "a slow host-to-device load-back, layer by layer, on the copy stream"
    WHEN: ClassVar[str] = "PCIe contention during load-back"
    ACTS_IN: ClassVar[tuple[tuple[str, str], ...]] = (
        (
            "0.5.23+",
            "L2TransferEngine.submit_host_to_device (env "
            "SGLANG_TEST_HICACHE_H2D_DELAY_CYCLES -> torch.cuda._sleep per layer)",
        ),
        ("builtin", "refused: no such injector (dma-delay models the event)"),
    )
    CANNOT: ClassVar[str] = "anything on a CPU host: torch.cuda._sleep needs a GPU"
    BUILTIN_REFUSAL: ClassVar[str] = _NO_INJECTOR

    cycles: int = K.key(0, K.tokens, "GPU sleep cycles before each layer's copy")

    @classmethod
    def sglang_refusal(cls, version: str | None = None) -> str | None:
        why = _not_in(version)
        if why:
            return why
        import importlib.util

        torch_ok = importlib.util.find_spec("torch") is not None
        if not torch_ok or not __import__("torch").cuda.is_available():
            return "it sleeps on the GPU copy stream (torch.cuda._sleep) and this host has no GPU"
        return None

    def install(self, hooks: Hooks, schedule: Schedule) -> None:
        os.environ["SGLANG_TEST_HICACHE_H2D_DELAY_CYCLES"] = str(self.cycles)
        hooks.record(self.NAME, cycles=self.cycles)
