"""`--engine sglang`'s run configuration (frozen), built and checked by the CLI before launch."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import ClassVar

from hicache_diag.ranks import topology
from hicache_diag.runtime.server_args import ModelConfig, ServerArgs, WorkloadConfig
from hicache_diag.sglang.defaults import SGLANG_DEFAULTS
from hicache_diag.sglang.launch_facts import LaunchFacts
from hicache_diag.sglang.server import LaunchSpec

REQUEST_TIMEOUT_S = 120.0


@dataclass(frozen=True, slots=True)
class SglangRunConfig:
    engine: ClassVar[str] = "sglang"
    spec: LaunchSpec
    workload: WorkloadConfig
    python: str
    sglang_version: str
    cpu_kernel_names: dict[str, list[str]] = field(default_factory=dict)
    faults: tuple[str, ...] = ()
    seed: int = 0
    out: str | None = None
    hang_timeout: float = SGLANG_DEFAULTS["hang_timeout"]
    vocab_size: int = 512
    package_dir: str = ""  # where that release's sglang package lives (release-specific set-up)
    launch_facts: LaunchFacts = field(default_factory=LaunchFacts)
    release: dict = field(default_factory=dict)  # SglangInstall.facts(): what the manifest says
    notes: tuple[str, ...] = ()  # how the launch was adapted to this host and release

    @property
    def world_size(self) -> int:
        return self.spec.pp_size * self.spec.tp_size

    def for_trial(self, seed: int, out: str) -> SglangRunConfig:
        """This run with another seed and run dir (harness/engine.py `EngineConfig`)."""
        return replace(self, seed=seed, out=out, workload=replace(self.workload, seed=seed))

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
        return topology(self.spec.pp_size, self.spec.tp_size)
