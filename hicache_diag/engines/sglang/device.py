"""Which device a `--engine sglang` launch runs on, asked of the release's own torch.

The release's interpreter launches the server, so its torch (a CPU or a CUDA build, with what
`CUDA_VISIBLE_DEVICES` leaves it) is what decides, never the tool's. `--device auto` (the
default) takes CUDA when that torch sees a GPU for every rank this host launches (pp x tp, or one
node's share with --hosts) and the CPU otherwise, saying why where the host has NVIDIA devices;
`--device cuda` is refused (one line, exit 2, before anything starts) where it sees fewer;
`--device cpu` asks nothing. A host with no NVIDIA device node is a CPU host without importing
torch (seconds, on every CPU run).
"""

from __future__ import annotations

import glob
import json
import subprocess
from dataclasses import dataclass, field

from hicache_diag.engines.sglang.options import SglangOptions
from hicache_diag.errors import UsageError

PROBE_TIMEOUT_S = 120.0  # importing a CUDA torch on a loaded host takes tens of seconds

# Runs in the release's interpreter: what its torch sees (device_count reads NVML or the
# driver; names only for the GPUs the launch would use).
_CUDA_PROBE = """
import json, sys
need = int(sys.argv[1])
out = {}
try:
    import torch
    out["torch"] = torch.__version__
    out["cuda"] = torch.version.cuda
    out["count"] = torch.cuda.device_count() if out["cuda"] else 0
    if out["count"] and torch.cuda.is_available():
        out["names"] = [torch.cuda.get_device_name(i) for i in range(min(need, out["count"]))]
    elif out["count"]:
        out["count"] = 0
        out["why"] = "torch.cuda.is_available() is False"
except Exception as exc:
    out["error"] = "%s: %s" % (type(exc).__name__, exc)
print(json.dumps(out))
"""


@dataclass(frozen=True, slots=True)
class CudaFacts:
    """What the release's torch sees: its version, its CUDA build (None: a CPU build), how many
    GPUs it can use and the names of those the launch takes."""

    torch: str | None = None
    cuda: str | None = None
    count: int = 0
    names: tuple[str, ...] = ()
    why: str | None = None  # why it sees none though it is a CUDA build, or why it could not say

    def to_json(self) -> dict:
        gpus = list(self.names)
        return {"torch": self.torch, "cuda": self.cuda, "count": self.count, "gpus": gpus}

    def sees(self, python: str) -> str:
        """`torch 2.9.1+cu128 in PYTHON sees 1 GPU`, `... is a CPU build (no CUDA)`."""
        who = (f"torch {self.torch}" if self.torch else "torch") + f" in {python}"
        who += " (the release's interpreter)"
        if self.why and not self.torch:
            return f"{who} could not be asked ({self.why})"
        if not self.cuda:
            return f"{who} is a CPU build (no CUDA)"
        many = "GPU" if self.count == 1 else "GPUs"
        tail = f" ({self.why})" if self.why else ""
        return f"{who} sees {self.count} {many}{tail}"


@dataclass(frozen=True, slots=True)
class DeviceChoice:
    device: str  # "cpu" | "cuda"
    cuda: CudaFacts | None = None  # None: not asked (--device cpu, or no NVIDIA device here)
    notes: tuple[str, ...] = field(default=())  # why auto took the CPU on a GPU host

    @property
    def cpu(self) -> bool:
        return self.device == "cpu"

    def facts(self) -> dict:
        """What the manifest says of the device (manifest.json `device_facts`)."""
        out: dict = {"device": self.device}
        if self.cuda is not None:
            out.update(self.cuda.to_json())
        return out


def host_has_nvidia() -> bool:
    """Whether this host (or container) has an NVIDIA device node or driver entry at all."""
    return bool(glob.glob("/dev/nvidia[0-9]*") or glob.glob("/proc/driver/nvidia/gpus/*"))


def run_cuda_probe(python: str, need: int) -> dict:
    """The probe's answer (the seam tests inject "torch sees N GPUs" at)."""
    try:
        done = subprocess.run(
            [python, "-c", _CUDA_PROBE, str(need)],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": f"cannot run {python}: {exc}"}
    lines = done.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1]) if lines else {"error": _last(done.stderr)}
    except ValueError:
        return {"error": _last(done.stderr) or lines[-1][:200]}


def _last(text: str) -> str:
    return (text.strip().splitlines() or ["no output"])[-1][:200]


def cuda_facts(python: str, need: int) -> CudaFacts:
    info = run_cuda_probe(python, need)
    return CudaFacts(
        torch=info.get("torch"),
        cuda=info.get("cuda"),
        count=int(info.get("count") or 0),
        names=tuple(info.get("names") or ()),
        why=info.get("why") or info.get("error"),
    )


def gpus_needed(options: SglangOptions) -> int:
    """One GPU per rank this host launches: all of them, or one node's share with --hosts
    (the other nodes' hosts are not probed from here)."""
    world = options.pp * options.tp
    return world // options.nnodes if options.hosts else world


def _need_text(options: SglangOptions, need: int) -> str:
    share = f", this node's share of {options.nnodes}" if options.hosts else ""
    gpus = "GPU" if need == 1 else "GPUs"
    ranks = f"{options.how('pp')} {options.pp} x {options.how('tp')} {options.tp}"
    return f"{ranks} needs {need} {gpus}{share}"


def choose_device(options: SglangOptions, python: str) -> DeviceChoice:
    """The device this launch runs on; UsageError (exit 2) for `--device cuda` that cannot."""
    if options.device == "cpu":
        return DeviceChoice("cpu")
    if options.device == "auto" and not host_has_nvidia():
        return DeviceChoice("cpu")
    need = gpus_needed(options)
    facts = cuda_facts(python, need)
    if facts.count >= need:
        return DeviceChoice("cuda", facts)
    why = facts.sees(python)
    if options.device == "cuda":
        raise UsageError(f"{options.how('device')} cuda: {why}; {_need_text(options, need)}")
    note = f"device cpu (--device auto): {why}; {_need_text(options, need)}"
    return DeviceChoice("cpu", facts, (note,))
