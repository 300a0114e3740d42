"""Mirrors sglang/srt/server_args.py: the runtime's frozen configs, with SGLang's field names."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import ClassVar

from hicache_diag.engines.builtin.options import BuiltinOptions
from hicache_diag.engines.builtin.runtime.protocol import ProtocolConfig
from hicache_diag.errors import UsageError
from hicache_diag.options.workloads import WorkloadConfig

# The run options' defaults (run_options.py is their one home); the fields keep SGLang's names.
_DEFAULT = BuiltinOptions()


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
    pp_size: int = _DEFAULT.pp
    tp_size: int = _DEFAULT.tp
    pp_async_batch_depth: int = _DEFAULT.async_depth
    page_size: int = _DEFAULT.page_size
    max_total_tokens: int = _DEFAULT.max_total_tokens
    max_running_requests: int = 8
    chunked_prefill_size: int = 256
    enable_hierarchical_cache: bool = True
    hicache_size: int = 0  # bytes per rank; 0 => hicache_ratio x device capacity
    hicache_ratio: float = _DEFAULT.hicache_ratio
    hicache_write_policy: str = _DEFAULT.hicache_write_policy
    hicache_storage_backend: str = _DEFAULT.hicache_storage_backend
    hicache_storage_dir: str | None = None
    hicache_storage_prefetch_policy: str = _DEFAULT.hicache_storage_prefetch_policy
    device: str = "cpu"  # the runtime runs on the CPU only (options: auto is its CPU)
    model: ModelConfig = field(default_factory=ModelConfig)

    def __post_init__(self) -> None:
        """What only the model and the pools can say (the options' own checks ran before:
        run_options.py)."""
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
    def vocab_size(self) -> int:
        return self.model.vocab_size

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
class RunConfig:
    """Everything one `run` needs; manifest.json is dataclasses.asdict of this."""

    engine: ClassVar[str] = "builtin"

    server_args: ServerArgs = field(default_factory=ServerArgs)
    protocol: ProtocolConfig = field(default_factory=ProtocolConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    faults: tuple[str, ...] = ()  # fault specs, validated by hicache_diag.faults before launch
    seed: int = _DEFAULT.seed
    out: str | None = None
    hang_timeout: float = _DEFAULT.hang_timeout
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
        """This run with another seed and run dir (trials/engine.py `EngineConfig`)."""
        return replace(self, seed=seed, out=out, workload=replace(self.workload, seed=seed))


# The workloads space arrivals at most this many steps apart (workloads.py, `idle`).
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
