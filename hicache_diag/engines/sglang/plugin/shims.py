"""The CPU compatibility shims (reference/sglang-on-cpu.md): the five places where SGLang 0.5.x
assumes a CUDA build. Each is as small as the assumption it replaces; none changes a decision
SGLang makes, only how a copy or an import is carried out on this host.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import logging
import sys
import types
from collections.abc import Callable

from hicache_diag.engines.sglang.plugin.post_import import when_imported

logger = logging.getLogger(__name__)


def neutralise_torchvision_meta() -> None:
    """torchvision's only wheel here is a CUDA build whose `_meta_registrations` registers fake
    kernels for ops its missing CUDA library never defined. Nothing on the serving path uses
    those fake kernels (they serve torch.compile tracing), so the submodule becomes empty."""
    if "torchvision._meta_registrations" in sys.modules:
        return
    if importlib.util.find_spec("torchvision") is None:
        return
    sys.modules["torchvision._meta_registrations"] = types.ModuleType(
        "torchvision._meta_registrations"
    )


def assign_req_to_token_pool_cpu(
    req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, _stride
) -> None:
    """Plain-torch twin of the CPU kernel: row i of req_to_token gets its slice of out_cache_loc."""
    pos = 0
    for i, row in enumerate(req_pool_indices.tolist()):
        start, end = int(start_offset[i]), int(end_offset[i])
        req_to_token[row, start:end] = out_cache_loc[pos : pos + (end - start)]
        pos += end - start


def _unavailable(module: str, name: str) -> Callable:
    def stub(*_args, **_kwargs):
        raise NotImplementedError(
            f"{module}.{name} is a CPU kernel that this host does not have (hicache-diag shim)"
        )

    stub.__name__ = name
    stub.__hicache_diag_stub__ = True  # type: ignore[attr-defined]
    return stub


class _KernelFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves exactly the sgl_kernel modules in `names`; any other sgl_kernel module stays
    missing (ModuleNotFoundError), as on a host without the package."""

    def __init__(self, names: dict[str, list[str]]) -> None:
        self.names = names

    def find_spec(self, fullname, path, target=None):
        if fullname == "sgl_kernel" or fullname in self.names:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []  # a package, so `sgl_kernel.mamba` resolves through this finder
        for name in self.names.get(spec.name, []):
            setattr(module, name, _unavailable(spec.name, name))
        if spec.name == "sgl_kernel":
            module.assign_req_to_token_pool_cpu = assign_req_to_token_pool_cpu
        return module

    def exec_module(self, module) -> None:
        return None


def install_sgl_kernel(names: dict[str, list[str]]) -> None:
    if importlib.util.find_spec("sgl_kernel") is not None:
        return  # a real CPU build of sgl_kernel is installed: use it
    names = {m: list(v) for m, v in names.items()}
    names.setdefault("sgl_kernel", [])
    if "assign_req_to_token_pool_cpu" not in names["sgl_kernel"]:
        names["sgl_kernel"].append("assign_req_to_token_pool_cpu")
    sys.meta_path.insert(0, _KernelFinder(names))


def transfer_kv_direct(src_layers, dst_layers, src_indices, dst_indices, page_size) -> None:
    """Token-indexed copy between layer buffers (the `direct` io backend, `layer_first`)."""
    src_idx = src_indices.to(device="cpu", dtype=src_indices.dtype)
    dst_idx = dst_indices.to(device="cpu", dtype=dst_indices.dtype)
    for src, dst in zip(src_layers, dst_layers, strict=True):
        dst[dst_idx] = src[src_idx].to(dst.device)


def _no_pinning(module) -> None:
    """HostKVCache keeps `pin_memory` (default True) and hands it to cudaHostRegister and to
    torch.zeros(pin_memory=...) (the L3 bounce pages); neither exists on CPU: always False."""
    module.HostKVCache.pin_memory = property(lambda self: False, lambda self, value: None)


def _add_transfer_kv_direct(module) -> None:
    """Absent (0.5.2x imports it only on CUDA/HIP) or our raising stub (0.5.1x imports it from
    sgl_kernel.kvcacheio on every platform but NPU/XPU/MPS): the plain-torch copy either way."""
    current = getattr(module, "transfer_kv_direct", None)
    if current is None or getattr(current, "__hicache_diag_stub__", False):
        module.transfer_kv_direct = transfer_kv_direct


def install_cpu_shims(kernel_names: dict[str, list[str]]) -> None:
    neutralise_torchvision_meta()
    install_sgl_kernel(kernel_names)
    when_imported("sglang.srt.mem_cache.pool_host.base", _no_pinning)
    when_imported("sglang.srt.mem_cache.pool_host.mha", _add_transfer_kv_direct)
    # Releases before the pool_host/ package (0.5.13 and older) keep both in one module.
    when_imported("sglang.srt.mem_cache.memory_pool_host", _no_pinning)
    when_imported("sglang.srt.mem_cache.memory_pool_host", _add_transfer_kv_direct)
