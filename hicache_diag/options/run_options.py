"""The run vocabulary both engines speak: `RunOptions`, each default and each check written once.

Layered like mini-sglang's configs: the common fields, then each engine's own
(`BuiltinOptions`, `SglangOptions`). Built by `parse_run_options` from the command line over a
scenario file (the one parser, used by `run`, `bisect` and `timeline`); variants come from
`with_value` / `dataclasses.replace` (bisect cells, campaign trials, release axes). No torch,
no engine package: `--help` and bad input never import either engine.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, ClassVar

from hicache_diag.errors import UsageError
from hicache_diag.options.limits import check_async_depth, check_int, check_seconds, check_seed
from hicache_diag.options.no_effect import refuse_no_effect
from hicache_diag.options.sizes import parse_size

if TYPE_CHECKING:
    from hicache_diag.faults.base import Fault

WORKLOADS = ("shared-prefix", "random", "long-prompt", "idle")
# Scripted over SGLang's HTTP API (hicache_diag/engines/sglang/sessions.py): --engine sglang only.
SGLANG_WORKLOADS = ("session-timeout", "session-close", "flush-timeout", "overload")
WRITE_POLICIES = ("write_through", "write_back", "write_through_selective")
STORAGE_BACKENDS = ("none", "file")
PREFETCH_POLICIES = ("best_effort", "wait_complete", "timeout")
# auto: --engine sglang takes CUDA when the release's torch sees a GPU per rank, else the CPU
# (engines/sglang/device.py); the builtin runtime has the CPU only.
DEVICES = ("auto", "cpu", "cuda")


def _scenario_kind(*types: type) -> dict[str, tuple[type, ...]]:
    return {"scenario": types}


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

    pp: int = 2
    tp: int = 1
    async_depth: int = 0
    page_size: int = 4
    max_total_tokens: int = 256
    hicache_size: str = field(default="0", metadata=_scenario_kind(str, int))
    hicache_ratio: float = 2.0
    hicache_write_policy: str = "write_through"
    hicache_storage_backend: str = "none"
    hicache_storage_dir: str | None = None
    hicache_storage_prefetch_policy: str = "best_effort"
    workload: str = "shared-prefix"
    requests: int = 32
    max_new_tokens: int = 8
    hang_timeout: float = 5.0
    device: str = "auto"
    seed: int = 0
    out: str | None = None
    faults: tuple[str, ...] = ()  # the scenario's fault specs, then the command line's
    check: bool = False  # run --check: the scenario's [expect] is the test
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
        refuse_no_effect(self)  # inputs that would do nothing or contradict (no_effect.py)

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
        return self.given.get(name) or "--" + name.replace("_", "-")

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
            raise UsageError(
                f"{how}: --{name.replace('_', '-')} is not a run option of --engine {self.engine}"
            )
        value = _typed(name, text, _field_type(type(self), name), how)
        if isinstance(value, tuple):  # a list option (--fix): the value joins the others
            value = getattr(self, name) + value
        return replace(self, **{name: value}, given={**self.given, name: how})


@dataclass(frozen=True, slots=True)
class BuiltinOptions(RunOptions):
    """Our compact runtime: its protocol switches and its step budget."""

    engine: ClassVar[str] = "builtin"
    summary: ClassVar[str] = "our compact runtime"
    trial_timeout_s: ClassVar[float] = 300.0  # a bisect trial: ranks start in about a second

    protocol: str = "full"
    fix: tuple[str, ...] = ()  # --fix NAME=MODE, applied last
    scenario_fix: tuple[str, ...] = ()  # the scenario's `fix` list (refines its preset)
    max_steps: int | None = None  # None: automatic (runtime/server_args.auto_step_budget)

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

    @classmethod
    def fault_refusal(cls, fault: type[Fault]) -> str | None:
        return fault.BUILTIN_REFUSAL or None


ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BUILTIN_SWITCH = (
    "{how} is a builtin-engine switch; with --engine sglang the protocol is the one the installed "
    "SGLang release contains (pick a release with --sglang-python)"
)


@dataclass(frozen=True, slots=True)
class SglangOptions(RunOptions):
    """The real SGLang server: the release to run and its own switches. Real SGLang on a 2-core
    CPU starts in tens of seconds and steps in milliseconds, so silence means more here."""

    engine: ClassVar[str] = "sglang"
    summary: ClassVar[str] = "the real SGLang server"
    trial_timeout_s: ClassVar[float] = 900.0  # a bisect trial: start-up alone takes tens of s
    # SGLang's CPU path (torch_native attention over a cached prefix, float32) strays further
    # from `transformers`: 0.5.19 runs flipped tokens at reference gaps of 0.00115 and 0.0019,
    # the rest of each output identical.
    tie_tolerance: ClassVar[float] = 5e-3
    # Flags of the other engine refused with a reason of their own.
    foreign: ClassVar[Mapping[str, str]] = {"protocol": _BUILTIN_SWITCH, "fix": _BUILTIN_SWITCH}

    requests: int = 24
    hang_timeout: float = 30.0
    model: str | None = None
    sglang_arg: tuple[str, ...] = ()
    sglang_env: tuple[str, ...] = field(default=(), metadata=_scenario_kind(dict))
    sglang_python: str | None = None
    sglang_version: str | None = None  # a scenario's release (bisect: --sglang-version)
    sglang_consensus_checker: bool = False
    nnodes: int = 1  # SGLang's --nnodes: one server per node, PP stages on different nodes
    hosts: str | None = None  # --hosts A,B: node i on hosts[i] (docs/cluster.md), else loopback
    via: str | None = None  # the launcher for --hosts: ssh (the only one built for run)
    ssh_config: str | None = None  # ssh -F FILE
    # Trials of one config reuse a server proven clean on every rank (sglang/warm.py).
    warm_server: bool = False

    def __post_init__(self) -> None:
        RunOptions.__post_init__(self)
        self._check_nodes()
        if self.max_total_tokens < 64 * self.page_size:
            raise UsageError(
                f"{self.how('max_total_tokens')} {self.max_total_tokens} is too small for SGLang "
                f"(use >= {64 * self.page_size})"
            )
        if self.host_bytes % 1024**3:
            raise UsageError(
                f"{self.how('hicache_size')} {self.hicache_size}: with --engine sglang the host "
                "pool is sized in whole GiB (SGLang's unit); use e.g. 1GiB, or --hicache-ratio "
                "for smaller pools"
            )
        self.server_env()

    def _check_nodes(self) -> None:
        """SGLang splits PP stages over nodes, or a stage's TP ranks when there are more nodes
        than stages (entrypoints/engine.py `_calculate_rank_ranges`): each node a whole share."""
        check_int(self.how("nnodes"), self.nnodes, 1)
        pp, n = self.pp, self.nnodes
        if pp % n == 0 or (n % pp == 0 and self.tp % (n // pp) == 0):
            return
        raise UsageError(
            f"{self.how('nnodes')} {n} does not split --pp {pp} x --tp {self.tp} evenly: give "
            "a divisor of --pp (whole stages per node), or a multiple of it that divides --tp"
        )

    def server_env(self) -> tuple[tuple[str, str], ...]:
        """--sglang-env NAME=VALUE pairs: the server's own switches."""
        pairs = []
        for item in self.sglang_env:
            name, sep, val = item.partition("=")
            if not sep or not ENV_NAME.fullmatch(name):
                raise UsageError(
                    f"{self.how('sglang_env')} {item!r}: expected NAME=VALUE, e.g. "
                    "SGLANG_REQ_WAITING_TIMEOUT=1.5"
                )
            pairs.append((name, val))
        return tuple(pairs)


# Other names of options on the command line and in scenario files.
OPTION_ALIASES = {
    "storage_backend": "hicache_storage_backend",
    "storage_dir": "hicache_storage_dir",
}

# Each engine's options, by its registry name (engines/registry.py registers the engines).
ENGINE_OPTIONS: Mapping[str, type[RunOptions]] = {
    cls.engine: cls for cls in (BuiltinOptions, SglangOptions)
}
DEFAULT_ENGINE = BuiltinOptions.engine


def field_names(cls: type[RunOptions]) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls) if f.name != "given")


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
