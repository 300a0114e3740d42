"""The server's launch line: our run options in SGLang's own flag names (docs/design.md §8)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from hicache_diag.engines.sglang.options import SglangOptions

_DEFAULT = SglangOptions()  # the defaults are the run options' (one home)
# reference/sglang-on-cpu.md: the CPU platform, its attention backend, and the HiCache copy path
# that needs no CUDA kernel.
CPU_ARGS = ["--device", "cpu", "--attention-backend", "torch_native", "--disable-cuda-graph"]
CPU_ARGS += ["--hicache-io-backend", "direct", "--hicache-mem-layout", "layer_first"]


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """Everything the launch needs, in SGLang's own flag names (docs/design.md §8)."""

    model: Path
    pp_size: int = _DEFAULT.pp
    tp_size: int = _DEFAULT.tp
    page_size: int = _DEFAULT.page_size
    max_total_tokens: int = _DEFAULT.max_total_tokens
    hicache_ratio: float | None = _DEFAULT.hicache_ratio
    hicache_size_gb: int = 0
    hicache_write_policy: str = _DEFAULT.hicache_write_policy
    hicache_storage_backend: str | None = None
    hicache_storage_dir: str | None = None
    hicache_storage_prefetch_policy: str | None = None
    extra_args: tuple[str, ...] = ()
    cpu: bool = True
    env: tuple[tuple[str, str], ...] = ()  # SGLang's own switches (--sglang-consensus-checker)
    # Directories imported before the release's site-packages (--patch: the patched overlay).
    pythonpath: tuple[str, ...] = ()
    # SGLang's multi-node launch (docs/cluster.md): this server's share of an `nnodes` launch.
    nnodes: int = _DEFAULT.nnodes
    node_rank: int = 0
    dist_init_addr: str | None = None  # HOST:PORT of node 0's torch.distributed rendezvous
    host: str = "127.0.0.1"

    def argv(self, python: str, port: int) -> list[str]:
        args = [python, "-m", "sglang.launch_server", "--model-path", str(self.model)]
        args += ["--host", self.host, "--port", str(port)]
        args += ["--pp-size", str(self.pp_size), "--tp-size", str(self.tp_size)]
        if self.nnodes > 1:
            args += ["--nnodes", str(self.nnodes), "--node-rank", str(self.node_rank)]
            args += ["--dist-init-addr", str(self.dist_init_addr)]
        args += ["--page-size", str(self.page_size)]
        args += ["--max-total-tokens", str(self.max_total_tokens)]
        args += ["--enable-hierarchical-cache", "--hicache-write-policy", self.hicache_write_policy]
        args += ["--skip-server-warmup", *self._host_pool_args(), *self._storage_args()]
        if self.cpu:
            args += CPU_ARGS
        return args + list(self.extra_args)

    def _host_pool_args(self) -> list[str]:
        if self.hicache_size_gb:
            return ["--hicache-size", str(self.hicache_size_gb)]
        if self.hicache_ratio is not None:
            return ["--hicache-ratio", str(self.hicache_ratio)]
        return []

    def _storage_args(self) -> list[str]:
        args = []
        if self.hicache_storage_backend:
            args += ["--hicache-storage-backend", self.hicache_storage_backend]
            if "--hicache-storage-backend-extra-config" not in self.extra_args:
                # SGLang prefetches only prompts of >= 256 tokens by default; the workload's
                # prompts are shorter, so the threshold comes down to two pages.
                threshold = json.dumps({"prefetch_threshold": 2 * self.page_size})
                args += ["--hicache-storage-backend-extra-config", threshold]
        if self.hicache_storage_prefetch_policy:
            args += ["--hicache-storage-prefetch-policy", self.hicache_storage_prefetch_policy]
        return args


__all__ = ["LaunchSpec"]
