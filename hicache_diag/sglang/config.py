"""`--engine sglang`'s run configuration (frozen), built and checked by the CLI before launch."""

from __future__ import annotations

from dataclasses import dataclass, field

from hicache_diag.runtime.server_args import ModelConfig, ServerArgs, WorkloadConfig
from hicache_diag.sglang.launch_facts import LaunchFacts
from hicache_diag.sglang.server import LaunchSpec

# Defaults where the builtin engine's do not fit real SGLang on a 2-core CPU: start-up takes
# tens of seconds and a step a few milliseconds, so silence means more here.
SGLANG_DEFAULTS = {
    "max_total_tokens": 256,  # small enough that hot prefixes cycle through the host tier
    "hang_timeout": 30.0,
    "requests": 24,
}
REQUEST_TIMEOUT_S = 120.0


@dataclass(frozen=True, slots=True)
class SglangRunConfig:
    spec: LaunchSpec
    workload: WorkloadConfig
    python: str
    sglang_version: str
    cpu_kernel_names: dict[str, list[str]] = field(default_factory=dict)
    faults: tuple[str, ...] = ()
    seed: int = 0
    out: str | None = None
    hang_timeout: float = 30.0
    vocab_size: int = 512
    package_dir: str = ""  # where that release's sglang package lives (release-specific set-up)
    launch_facts: LaunchFacts = field(default_factory=LaunchFacts)
    release: dict = field(default_factory=dict)  # SglangInstall.facts(): what the manifest says
    notes: tuple[str, ...] = ()  # how the launch was adapted to this host and release

    @property
    def world_size(self) -> int:
        return self.spec.pp_size * self.spec.tp_size

    def workload_server_args(self) -> ServerArgs:
        """What the workload generator reads: the pool size and the model's vocabulary."""
        return ServerArgs(
            pp_size=1,
            tp_size=1,
            page_size=self.spec.page_size,
            max_total_tokens=self.spec.max_total_tokens,
            chunked_prefill_size=self.spec.max_total_tokens,
            model=ModelConfig(vocab_size=self.vocab_size, num_layers=1),
        )

    def topology(self) -> dict:
        ranks = [
            {"rank": p * self.spec.tp_size + t, "pp": p, "tp": t}
            for p in range(self.spec.pp_size)
            for t in range(self.spec.tp_size)
        ]
        return {"pp": self.spec.pp_size, "tp": self.spec.tp_size,
                "world_size": self.world_size, "ranks": ranks}  # fmt: skip
