"""The run vocabulary every engine speaks: `RunOptions`, each field declared once with its flag
(options/params.py), each default and each check written once.

Layered like mini-sglang's configs: these common fields, then each engine's own, in the
engine's folder (engines/builtin/options.py, engines/sglang/options.py; the registry's entry
names its class). Built by `parse_run_options` from the command line over a scenario file;
variants come from `with_value` / `dataclasses.replace` (bisect cells, campaign trials, release
axes). No torch, no engine package: `--help` and bad input never import either engine.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from functools import cache
from typing import TYPE_CHECKING, Any, ClassVar

from hicache_diag.errors import UsageError
from hicache_diag.options.limits import check_async_depth, check_int, check_seconds, check_seed
from hicache_diag.options.params import CACHE, COMMON, FAULTS, OUTPUT, Param, option, params
from hicache_diag.options.sizes import parse_size

if TYPE_CHECKING:
    from hicache_diag.faults.base import Fault

WORKLOADS = ("shared-prefix", "random", "long-prompt", "idle")
# Scripted over the server's HTTP API (sessions, /flush_cache): the engines that have one take
# them (engines/sglang/sessions.py), the others refuse them in their options.
SGLANG_WORKLOADS = ("session-timeout", "session-close", "flush-timeout", "overload")
WRITE_POLICIES = ("write_through", "write_back", "write_through_selective")
STORAGE_BACKENDS = ("none", "file")
PREFETCH_POLICIES = ("best_effort", "wait_complete", "timeout")
# auto: --engine sglang takes CUDA when the release's torch sees a GPU per rank, else the CPU
# (engines/sglang/device.py); the builtin runtime has the CPU only.
DEVICES = ("auto", "cpu", "cuda")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True, slots=True)
class RunOptions:
    """What every engine's run takes. `given` says, per field the user set, how it was written
    (`--pp`, or `scenario key 'pp'`): errors name that, and the no-effect rules read it."""

    engine: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    trial_timeout_s: ClassVar[float] = 300.0  # a bisect or rate-check trial
    # Reading a run whose reference.json records no tolerance (diagnosis/outputs.py): a reference
    # top-2 logit gap under this is a greedy tie either token may win. Our runtime's float32 sums
    # differ from the reference's by ~1e-5.
    tie_tolerance: ClassVar[float] = 1e-3

    pp: int = option(2, Param("--pp", "Pipeline stages.", "N", COMMON))
    tp: int = option(1, Param("--tp", "Tensor-parallel ranks per stage.", "N", COMMON))
    async_depth: int = option(
        0, Param("--async-depth", "Extra micro-batch slots; loop size is pp + depth.", "N", COMMON)
    )
    page_size: int = option(4, Param("--page-size", "Tokens per page.", "N", CACHE))
    max_total_tokens: int = option(
        256, Param("--max-total-tokens", "Device KV pool tokens.", "N", CACHE)
    )
    hicache_size: str = option(
        "0",
        Param(
            "--hicache-size",
            "Host pool bytes per rank, e.g. 64MiB; 0 uses --hicache-ratio.",
            "SIZE",
            CACHE,
        ),
        scenario_kind=(str, int),
    )
    hicache_ratio: float = option(
        2.0, Param("--hicache-ratio", "Host pool = X times the device pool.", "X", CACHE)
    )
    hicache_write_policy: str = option(
        "write_through",
        Param(
            "--hicache-write-policy",
            "write_through, write_back or write_through_selective.",
            "POLICY",
            CACHE,
        ),
    )
    hicache_storage_backend: str = option(
        "none",
        Param(
            "--hicache-storage-backend",
            "L3 backend: none or file.",
            "NAME",
            CACHE,
            aliases=("--storage-backend",),
        ),
    )
    hicache_storage_dir: str | None = option(
        None,
        Param(
            "--hicache-storage-dir",
            "L3 file directory (needs --storage-backend file).",
            "DIR",
            CACHE,
            aliases=("--storage-dir",),
            default_text="the run dir",
        ),
    )
    hicache_storage_prefetch_policy: str = option(
        "best_effort",
        Param(
            "--hicache-storage-prefetch-policy",
            "best_effort, wait_complete or timeout.",
            "POLICY",
            CACHE,
        ),
    )
    workload: str = option(
        "shared-prefix",
        Param(
            "--workload",
            "shared-prefix, random, long-prompt or idle; --engine sglang only: "
            "session-timeout, session-close, flush-timeout, overload (docs/sources.md).",
            "NAME",
            COMMON,
        ),
    )
    requests: int = option(32, Param("--requests", "Number of requests.", "N", COMMON))
    max_new_tokens: int = option(
        8, Param("--max-new-tokens", "Tokens generated per request.", "N", COMMON)
    )
    hang_timeout: float = option(
        5.0,
        Param(
            "--hang-timeout",
            "No rank step for this long (from the first step on) is a hang.",
            "SECONDS",
            COMMON,
        ),
    )
    device: str = option(
        "auto",
        Param(
            "--device",
            "auto, cpu or cuda. auto: --engine sglang runs on CUDA when the release's torch "
            "sees a GPU per rank, else on the CPU; cuda is refused where it cannot run.",
            "NAME",
            COMMON,
        ),
    )
    seed: int = option(0, Param("--seed", "Workload and fault seed.", "N", COMMON))
    out: str | None = option(
        None,
        Param(
            "--out", "Run directory; new or empty.", "DIR", OUTPUT, default_text="runs/<utc>-<seed>"
        ),
        scenario=False,
    )
    # the scenario's fault specs, then the command line's (a scenario gives [[fault]] tables)
    faults: tuple[str, ...] = option(
        (),
        Param("--fault", "Inject a fault: NAME[:key=value,...]; repeatable.", "SPEC", FAULTS),
        scenario=False,
    )
    check: bool = option(
        False,
        Param(
            "--check",
            "Compare the verdict with the scenario's [expect] table: exit 0 on a match, 4 if not.",
            panel=OUTPUT,
        ),
        scenario=False,
    )  # the scenario's [expect] is the test
    given: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("pp", "tp", "page_size"):
            check_int(self.how(name), getattr(self, name), 1)
        check_async_depth(self.async_depth)
        if self.max_total_tokens < self.page_size:
            raise UsageError(
                f"{self.how('max_total_tokens')} {self.max_total_tokens} is smaller than one "
                f"page ({self.page_size} tokens)"
            )
        self._check_pools()
        self._check_choices()
        self._check_storage()
        for name in ("requests", "max_new_tokens"):
            if getattr(self, name) <= 0:
                raise UsageError(f"{self.how(name)} must be > 0 (got {getattr(self, name)})")
        check_seconds(self.how("hang_timeout"), self.hang_timeout)
        check_seed(self.seed, self.how("seed"))

    def _check_pools(self) -> None:
        ratio = self.hicache_ratio
        if not (math.isfinite(ratio) and ratio > 0):
            raise UsageError(
                f"{self.how('hicache_ratio')} must be a finite number > 0 (got {ratio})"
            )
        if self.host_bytes < 0:
            raise UsageError(f"{self.how('hicache_size')} must be >= 0 (got {self.hicache_size})")

    def _check_choices(self) -> None:
        for name, what, valid in (
            ("hicache_write_policy", "write policy", WRITE_POLICIES),
            ("hicache_storage_backend", "storage backend", STORAGE_BACKENDS),
            ("hicache_storage_prefetch_policy", "prefetch policy", PREFETCH_POLICIES),
            ("device", "device", DEVICES),
            ("workload", "workload", WORKLOADS + SGLANG_WORKLOADS),
        ):
            value = getattr(self, name)
            if value not in valid:
                raise UsageError(f"unknown {what} {value!r}; valid: {', '.join(valid)}")

    def _check_storage(self) -> None:
        where = self.hicache_storage_dir
        if where is not None and not str(where).strip():
            raise UsageError(f"{self.how('hicache_storage_dir')} '' is empty; give a path")

    def how(self, name: str) -> str:
        """How the user wrote option `name` (the flag by default)."""
        return self.given.get(name) or flag_of(type(self), name)

    @classmethod
    def fault_refusal(cls, fault: type[Fault]) -> str | None:
        """Why this engine cannot run `fault` (it lacks the mechanism), or None: one line, exit 2
        before anything starts (faults/validate.py), and the faults `run --list-faults` leaves
        out. SGLang refuses per release, at its probe (sglang/release.py `refuse_unhookable`)."""
        return None

    @property
    def storage(self) -> bool:
        return self.hicache_storage_backend != "none"

    @property
    def host_bytes(self) -> int:
        return parse_size(self.hicache_size)

    @property
    def world_size(self) -> int:
        return self.pp * self.tp

    def with_value(self, name: str, text: str, how: str) -> RunOptions:
        """This run with option `name` set from `text` (a bisect axis value), typed as the
        field is, and checked again."""
        if name not in field_names(type(self)):
            raise UsageError(f"{how}: {name} is not a run option of --engine {self.engine}")
        value = _typed(name, text, _field_type(type(self), name), how)
        if isinstance(value, tuple):  # a list option (--switch): the value joins the others
            value = getattr(self, name) + value
        return replace(self, **{name: value}, given={**self.given, name: how})


def field_names(cls: type[RunOptions]) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls) if f.name != "given")


@cache
def flag_of(cls: type[RunOptions], name: str) -> str:
    """Field `name`'s flag (`--pp`); a field with no flag is named as its scenario key."""
    return next((str(p) for f, p in params(cls) if f.name == name), name)


def _field_type(cls: type[RunOptions], name: str) -> str:
    return next(str(f.type) for f in fields(cls) if f.name == name)


def _typed(name: str, text: str, kind: str, how: str) -> Any:
    """A command-line text as the field's type (bisect axis values)."""
    try:
        if kind.startswith("int"):
            return int(text)
        if kind.startswith("float"):
            return float(text)
    except ValueError:
        word = "an integer" if kind.startswith("int") else "a number"
        raise UsageError(f"{how}: {name.replace('_', '-')} must be {word} (got {text!r})") from None
    if kind.startswith("tuple"):
        return (text,)
    return text
