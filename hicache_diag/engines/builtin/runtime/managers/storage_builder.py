"""Builds a rank's L3 controller from its ServerArgs; ours (SGLang attaches the backend in
HiCacheController.attach_storage_backend)."""

from __future__ import annotations

import time
from collections.abc import Callable

from hicache_diag.engines.builtin.runtime.distributed.comm import HiCacheComm
from hicache_diag.engines.builtin.runtime.managers.storage_controller import (
    HostPool,
    StorageController,
)
from hicache_diag.engines.builtin.runtime.mem_cache.hicache_storage import (
    HiCacheFile,
    HiCacheStorageConfig,
)
from hicache_diag.engines.builtin.runtime.protocol import ProtocolConfig
from hicache_diag.engines.builtin.runtime.server_args import ServerArgs
from hicache_diag.errors import UsageError
from hicache_diag.faults.hooks import Hooks


def build_storage_controller(
    server_args: ServerArgs,
    protocol: ProtocolConfig,
    comm: HiCacheComm,
    host_pool: HostPool,
    *,
    hooks: Hooks | None = None,
    clock: Callable[[], float] = time.monotonic,
    default_dir: str | None = None,
) -> StorageController | None:
    """The rank's L3 controller (not started), or None with `--hicache-storage-backend none`.
    Without `--hicache-storage-dir` the pages go to `default_dir` (the run's own directory,
    never a fixed path shared by parallel runs). Raises UsageError for a bad directory."""
    if server_args.hicache_storage_backend == "none":
        return None
    path = server_args.hicache_storage_dir or default_dir
    if path is None:
        raise UsageError("--hicache-storage-backend file needs --hicache-storage-dir")
    config = HiCacheStorageConfig(
        comm.tp_rank, comm.tp_size, comm.pp_rank, comm.pp_size, server_args.model.name
    )
    storage = HiCacheFile(config, path, hooks)
    policy = server_args.hicache_storage_prefetch_policy
    return StorageController(
        storage, host_pool, server_args.page_size, comm, protocol, policy, clock=clock
    )
