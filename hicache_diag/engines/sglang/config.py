"""`--engine sglang`'s run configuration (frozen), built and checked by the CLI before launch."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from hicache_diag.engines.sglang.launch_facts import LaunchFacts
from hicache_diag.engines.sglang.launch_spec import LaunchSpec
from hicache_diag.evidence.ranks import topology
from hicache_diag.options.workloads import Pool, WorkloadConfig

REQUEST_TIMEOUT_S = 120.0


@dataclass(frozen=True, slots=True)
class SglangRunConfig:
    engine: ClassVar[str] = "sglang"
    spec: LaunchSpec
    workload: WorkloadConfig
    python: str
    sglang_version: str
    hang_timeout: float
    cpu_kernel_names: dict[str, list[str]] = field(default_factory=dict)
    faults: tuple[str, ...] = ()
    seed: int = 0
    out: str | None = None
    vocab_size: int = 512
    package_dir: str = ""  # where that release's sglang package lives (release-specific set-up)
    launch_facts: LaunchFacts = field(default_factory=LaunchFacts)
    release: dict = field(default_factory=dict)  # SglangInstall.facts(): what the manifest says
    # device.py DeviceChoice.facts(): the device the launch runs on and what the release's
    # torch saw (manifest.json `device`, `device_facts`).
    device: dict = field(default_factory=lambda: {"device": "cpu"})
    notes: tuple[str, ...] = ()  # how the launch was adapted to this host and release
    hosts: tuple[str, ...] = ()  # --hosts: node i on hosts[i] (--via ssh)
    ssh_config: str | None = None
    # nodes.py NodePlacement: the checked hosts (remote_nodes.py `place`, which
    # `run` calls); a config with hosts and no placement is refused at launch.
    placement: Any = None

    @property
    def device_name(self) -> str:
        return self.device.get("device", "cpu")

    @property
    def cuda_facts(self) -> dict | None:
        """What the release's torch saw of CUDA (None: it was not asked)."""
        facts = {k: v for k, v in self.device.items() if k != "device"}
        return facts or None

    @property
    def world_size(self) -> int:
        return self.spec.pp_size * self.spec.tp_size

    def for_trial(self, seed: int, out: str) -> SglangRunConfig:
        """This run with another seed and run dir (trials/engine.py `EngineConfig`)."""
        return replace(self, seed=seed, out=out, workload=replace(self.workload, seed=seed))

    def workload_pool(self) -> Pool:
        """What the workload generator reads: the pool size and the model's vocabulary."""
        total = self.spec.max_total_tokens
        return Pool(max_total_tokens=total, chunked_prefill_size=total, vocab_size=self.vocab_size)

    def topology(self) -> dict:
        return topology(self.spec.pp_size, self.spec.tp_size)
