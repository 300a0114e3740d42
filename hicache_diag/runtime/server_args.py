"""Mirrors sglang/srt/server_args.py: the runtime's frozen configs, with SGLang's field names."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import ClassVar

from hicache_diag.errors import UsageError
from hicache_diag.limits import check_async_depth
from hicache_diag.runtime.protocol import ProtocolConfig

WORKLOADS = ("shared-prefix", "random", "long-prompt", "idle")
# Scripted over SGLang's HTTP API (hicache_diag/sglang/sessions.py): --engine sglang only.
SGLANG_WORKLOADS = ("session-timeout", "session-close", "flush-timeout", "overload")
WRITE_POLICIES = ("write_through", "write_back", "write_through_selective")
STORAGE_BACKENDS = ("none", "file")
PREFETCH_POLICIES = ("best_effort", "wait_complete", "timeout")
DEVICES = ("cpu", "cuda")

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KiB|MiB|GiB|KB|MB|GB|K|M|G)?\s*$", re.IGNORECASE)
_UNITS = {
    "b": 1,
    "k": 1024,
    "kib": 1024,
    "kb": 1024,
    "m": 1024**2,
    "mib": 1024**2,
    "mb": 1024**2,
    "g": 1024**3,
    "gib": 1024**3,
    "gb": 1024**3,
}


def parse_size(text: str | int) -> int:
    """`64MiB` -> bytes. Accepts B, KiB, MiB, GiB (and K/M/G, KB/MB/GB as binary units)."""
    if isinstance(text, int):
        return text
    m = _SIZE_RE.match(str(text))
    if not m:
        raise UsageError(f"malformed size {text!r}; expected e.g. 512KiB, 64MiB, 1GiB")
    unit = (m.group(2) or "B").lower()
    return int(float(m.group(1)) * _UNITS[unit])


def _choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise UsageError(f"unknown {name} {value!r}; valid: {', '.join(choices)}")


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """The tiny deterministic transformer; weights derive from `weight_seed`."""

    num_layers: int = 5  # odd on purpose: PP2 stages differ in bytes per token (#29258)
    hidden_size: int = 64
    num_heads: int = 4
    head_dim: int = 16
    vocab_size: int = 256
    weight_seed: int = 1234
    name: str = "tiny-llama"


@dataclass(frozen=True, slots=True)
class ServerArgs:
    pp_size: int = 2
    tp_size: int = 1
    pp_async_batch_depth: int = 0
    page_size: int = 4
    max_total_tokens: int = 1024
    max_running_requests: int = 8
    chunked_prefill_size: int = 256
    enable_hierarchical_cache: bool = True
    hicache_size: int = 0  # bytes per rank; 0 => hicache_ratio x device capacity
    hicache_ratio: float = 2.0
    hicache_write_policy: str = "write_through"
    hicache_storage_backend: str = "none"
    hicache_storage_dir: str | None = None
    hicache_storage_prefetch_policy: str = "best_effort"
    device: str = "cpu"
    model: ModelConfig = field(default_factory=ModelConfig)

    def __post_init__(self) -> None:
        if self.pp_size < 1:
            raise UsageError(f"--pp must be >= 1 (got {self.pp_size})")
        if self.tp_size < 1:
            raise UsageError(f"--tp must be >= 1 (got {self.tp_size})")
        check_async_depth(self.pp_async_batch_depth, self.max_running_requests)
        if self.page_size < 1:
            raise UsageError(f"--page-size must be >= 1 (got {self.page_size})")
        if self.max_total_tokens < self.page_size:
            raise UsageError(
                f"--max-total-tokens {self.max_total_tokens} is smaller than one page "
                f"({self.page_size} tokens)"
            )
        if self.model.num_layers < self.pp_size:
            raise UsageError(
                f"--pp {self.pp_size} exceeds the model's {self.model.num_layers} layers"
            )
        if self.model.num_heads % self.tp_size:
            divisors = [
                d for d in range(1, self.model.num_heads + 1) if not self.model.num_heads % d
            ]
            raise UsageError(
                f"--tp {self.tp_size} does not divide the model's {self.model.num_heads} attention "
                f"heads; valid: {', '.join(map(str, divisors))}"
            )
        if not (math.isfinite(self.hicache_ratio) and self.hicache_ratio > 0):
            raise UsageError(
                f"--hicache-ratio must be a finite number > 0 (got {self.hicache_ratio})"
            )
        _choice("write policy", self.hicache_write_policy, WRITE_POLICIES)
        _choice("storage backend", self.hicache_storage_backend, STORAGE_BACKENDS)
        _choice("prefetch policy", self.hicache_storage_prefetch_policy, PREFETCH_POLICIES)
        _choice("device", self.device, DEVICES)
        if self.hicache_size < 0:
            raise UsageError(f"--hicache-size must be >= 0 (got {self.hicache_size})")
        if self.hicache_size and self.host_token_capacity() < self.page_size:
            raise UsageError(
                f"--hicache-size {self.hicache_size} B holds fewer tokens than one page "
                f"({self.page_size} tokens x {self.kv_bytes_per_token()} B/token)"
            )
        if not self.hicache_size and self.host_token_capacity() < self.page_size:
            raise UsageError(
                f"--hicache-ratio {self.hicache_ratio} x {self.max_total_tokens} device tokens "
                f"holds less than one page ({self.page_size} tokens) of host cache"
            )

    @property
    def pp_loop_size(self) -> int:
        return self.pp_size + self.pp_async_batch_depth

    @property
    def world_size(self) -> int:
        return self.pp_size * self.tp_size

    def layers_of_stage(self, pp_rank: int) -> range:
        """Contiguous layer split; earlier stages take the remainder, as SGLang's get_pp_indices."""
        n, pp = self.model.num_layers, self.pp_size
        base, extra = divmod(n, pp)
        start = pp_rank * base + min(pp_rank, extra)
        return range(start, start + base + (1 if pp_rank < extra else 0))

    def kv_bytes_per_token(self, pp_rank: int = 0) -> int:
        """Host bytes per token on this stage: K and V, float32, local layers, local heads.

        Stages with more layers need more bytes per token, so a fixed --hicache-size gives
        stages different token capacities (the skew #29258 fixes with a MIN).
        """
        layers = len(self.layers_of_stage(pp_rank))
        heads = max(1, self.model.num_heads // self.tp_size)
        return 2 * layers * heads * self.model.head_dim * 4

    def host_token_capacity(self, pp_rank: int = 0) -> int:
        """Host pool size in tokens, page aligned (before any MIN across PP)."""
        if self.hicache_size:
            tokens = self.hicache_size // self.kv_bytes_per_token(pp_rank)
        else:
            tokens = int(self.max_total_tokens * self.hicache_ratio)
        return tokens // self.page_size * self.page_size


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    workload: str = "shared-prefix"
    requests: int = 32
    max_new_tokens: int = 8
    seed: int = 0

    def __post_init__(self) -> None:
        _choice("workload", self.workload, WORKLOADS + SGLANG_WORKLOADS)
        if self.requests <= 0:
            raise UsageError(f"--requests must be > 0 (got {self.requests})")
        if self.max_new_tokens <= 0:
            raise UsageError(f"--max-new-tokens must be > 0 (got {self.max_new_tokens})")


@dataclass(frozen=True, slots=True)
class RunConfig:
    """Everything one `run` needs; manifest.json is dataclasses.asdict of this."""

    engine: ClassVar[str] = "builtin"

    server_args: ServerArgs = field(default_factory=ServerArgs)
    protocol: ProtocolConfig = field(default_factory=ProtocolConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    faults: tuple[str, ...] = ()  # fault specs, validated by hicache_diag.faults before launch
    seed: int = 0
    out: str | None = None
    hang_timeout: float = 5.0
    max_steps: int | None = None  # the step budget (--max-steps); None: auto_step_budget

    @property
    def world_size(self) -> int:
        return self.server_args.world_size

    @property
    def step_budget(self) -> int:
        if self.max_steps is not None:
            return self.max_steps
        return auto_step_budget(self.server_args, self.workload)

    def for_trial(self, seed: int, out: str) -> RunConfig:
        """This run with another seed and run dir (harness/engine.py `EngineConfig`)."""
        return replace(self, seed=seed, out=out, workload=replace(self.workload, seed=seed))


# The workloads space arrivals at most this many steps apart (harness/workload.py, `idle`).
MAX_ARRIVAL_GAP = 25


def auto_step_budget(sa: ServerArgs, wl: WorkloadConfig) -> int:
    """The default --max-steps: twice what a run needs if its requests went one at a time (each
    token one visit of its slot, a visit every pp_loop_size steps) after the last arrival, plus
    1000. A healthy run ends long before; only a run that steps without finishing reaches it,
    and that is `undecided`, never a form (the budget is ours, not the user's bug)."""
    return wl.requests * auto_steps_per_request(sa, wl) + AUTO_STEP_SLACK


AUTO_STEP_SLACK = 1000


def auto_steps_per_request(sa: ServerArgs, wl: WorkloadConfig) -> int:
    return MAX_ARRIVAL_GAP + 2 * (wl.max_new_tokens + 1) * sa.pp_loop_size
