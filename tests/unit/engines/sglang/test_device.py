"""`--engine sglang`'s device, decided by the release's own torch (engines/sglang/device.py).

"torch sees N GPUs" is injected where the release's probe answers (`run_cuda_probe`), so the
CUDA paths run on this CPU host: `--device cuda` is refused (one line) where that torch sees no
CUDA or fewer GPUs than the launch's ranks; `auto` takes CUDA when it sees enough, the CPU
otherwise (saying why on a GPU host); a CUDA launch has no CPU flags, no CPU engine switch and
no CPU shims, and its manifest and verdict say cuda.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hicache_diag.engines.builtin.options import BuiltinOptions
from hicache_diag.engines.sglang import device as dev
from hicache_diag.engines.sglang import trial as sglang_trial
from hicache_diag.engines.sglang.config import SglangRunConfig
from hicache_diag.engines.sglang.launch_spec import CPU_ARGS, LaunchSpec
from hicache_diag.engines.sglang.options import SglangOptions
from hicache_diag.engines.sglang.release import SglangInstall
from hicache_diag.engines.sglang.server import SglangServer
from hicache_diag.errors import UsageError
from hicache_diag.options.workloads import WorkloadConfig

PY = "/opt/release/bin/python"
CUDA_TORCH = {"torch": "2.9.1+cu128", "cuda": "12.8"}


@pytest.fixture
def probe(monkeypatch):
    """Answer the release's probe with `answer`; record each call. A GPU host by default."""
    calls: list[tuple[str, int]] = []
    state = {"answer": {}, "nvidia": True}

    def fake(python, need):
        calls.append((python, need))
        return dict(state["answer"])

    monkeypatch.setattr(dev, "run_cuda_probe", fake)
    monkeypatch.setattr(dev, "host_has_nvidia", lambda: state["nvidia"])
    state["calls"] = calls
    return state


def _sees(count: int, **extra) -> dict:
    names = [f"NVIDIA H100 80GB HBM3 #{i}" for i in range(count)]
    return {**CUDA_TORCH, "count": count, "names": names, **extra}


@pytest.mark.parametrize(
    "answer, words",
    [
        (_sees(0), f"torch 2.9.1+cu128 in {PY} (the release's interpreter) sees 0 GPUs"),
        (_sees(1), "sees 1 GPU; --pp 2 x --tp 1 needs 2 GPUs"),
        (
            {"torch": "2.13.0+cpu", "cuda": None, "count": 0},
            f"torch 2.13.0+cpu in {PY} (the release's interpreter) is a CPU build (no CUDA)",
        ),
        (
            {"error": "ModuleNotFoundError: No module named 'torch'"},
            "could not be asked (ModuleNotFoundError",
        ),
        (
            _sees(0, why="torch.cuda.is_available() is False"),
            "sees 0 GPUs (torch.cuda.is_available() is False)",
        ),
    ],
    ids=["no-gpu", "one-of-two", "cpu-build", "no-torch", "unavailable"],
)
def test_device_cuda_is_refused_in_one_line_where_the_release_torch_cannot(probe, answer, words):
    probe["answer"] = answer
    with pytest.raises(UsageError) as err:
        dev.choose_device(SglangOptions(device="cuda"), PY)
    text = str(err.value)
    assert text.startswith("--device cuda: ") and "\n" not in text
    assert words in text
    assert probe["calls"] == [(PY, 2)]  # the release's interpreter, asked for pp x tp


def test_device_cuda_with_a_gpu_per_rank_runs_on_cuda(probe):
    probe["answer"] = _sees(4)
    choice = dev.choose_device(SglangOptions(device="cuda", pp=2, tp=2), PY)
    assert probe["calls"] == [(PY, 4)]
    assert choice.device == "cuda" and not choice.cpu and choice.notes == ()
    assert choice.facts() == {
        "device": "cuda",
        "torch": "2.9.1+cu128",
        "cuda": "12.8",
        "count": 4,
        "gpus": [f"NVIDIA H100 80GB HBM3 #{i}" for i in range(4)],
    }


def test_auto_takes_cuda_when_the_release_sees_enough_and_the_cpu_with_a_note_when_not(probe):
    probe["answer"] = _sees(2)
    assert dev.choose_device(SglangOptions(), PY).device == "cuda"  # auto is the default
    probe["answer"] = _sees(1)
    choice = dev.choose_device(SglangOptions(), PY)
    assert choice.device == "cpu" and choice.cuda is not None
    (note,) = choice.notes
    assert note.startswith("device cpu (--device auto): torch 2.9.1+cu128 in /opt/release")
    assert note.endswith("sees 1 GPU; --pp 2 x --tp 1 needs 2 GPUs")


def test_a_cpu_host_and_device_cpu_never_import_the_release_torch(probe):
    probe["nvidia"] = False
    assert dev.choose_device(SglangOptions(), PY) == dev.DeviceChoice("cpu")
    probe["nvidia"] = True
    assert dev.choose_device(SglangOptions(device="cpu"), PY) == dev.DeviceChoice("cpu")
    assert probe["calls"] == []
    # --device cuda asks even with no device node: the release's torch gives the reason
    probe["nvidia"], probe["answer"] = False, _sees(0)
    with pytest.raises(UsageError, match="sees 0 GPUs"):
        dev.choose_device(SglangOptions(device="cuda", pp=1), PY)


def test_with_hosts_this_host_is_checked_for_its_node_share(probe):
    probe["answer"] = _sees(1)
    opts = SglangOptions(device="cuda", pp=2, nnodes=2, hosts="a,b")
    assert dev.choose_device(opts, PY).device == "cuda"
    assert probe["calls"] == [(PY, 1)]


def test_the_builtin_engine_refuses_cuda_before_torch_and_auto_is_its_cpu():
    with pytest.raises(UsageError) as err:
        BuiltinOptions(device="cuda")
    assert str(err.value) == (
        "--device cuda: the builtin engine runs on the CPU only (its tiny model, KV pools and "
        "gloo transport); use --engine sglang for a GPU"
    )
    assert BuiltinOptions().device == "auto"
    with pytest.raises(UsageError, match="unknown device 'tpu'; valid: auto, cpu, cuda"):
        SglangOptions(device="tpu")


@pytest.mark.process
def test_the_real_probe_answers_for_this_interpreter():
    """The probe script itself, run by this (CPU) interpreter: a CPU build, no GPU."""
    import sys

    facts = dev.cuda_facts(sys.executable, 2)
    assert facts.torch and facts.count == 0 and facts.names == ()
    assert "in " + sys.executable in facts.sees(sys.executable)


# -- a CUDA launch ----------------------------------------------------------------------------


def _cuda_cfg(tmp_path: Path) -> SglangRunConfig:
    spec = LaunchSpec(model=tmp_path / "model", cpu=False)
    cuda = dev.CudaFacts(**CUDA_TORCH, count=2, names=("H100", "H100"))
    facts = dev.DeviceChoice("cuda", cuda)
    return SglangRunConfig(
        spec=spec,
        workload=WorkloadConfig("shared-prefix", 4, 2, 0),
        python=PY,
        sglang_version="0.5.23",
        hang_timeout=5.0,
        device=facts.facts(),
    )


def test_a_cuda_launch_has_no_cpu_flags_switch_or_shims(tmp_path, monkeypatch):
    cfg = _cuda_cfg(tmp_path)
    argv = cfg.spec.argv(PY, 30000)
    for flag in ("--device", "--attention-backend", "--disable-cuda-graph", "--hicache-io-backend"):
        assert flag not in argv
    install = SglangInstall(PY, "0.5.23", tmp_path)
    env = SglangServer(install, cfg.spec, tmp_path).env(tmp_path / "plugin.json")
    assert "SGLANG_USE_CPU_ENGINE" not in env and "SGLANG_CPU_OMP_THREADS_BIND" not in env

    class Server:
        port = 30000

    monkeypatch.setattr(sglang_trial, "make_server", lambda *a, **k: Server())
    engine = sglang_trial.SglangEngine(cfg)
    engine.prepare(tmp_path)
    plugin = json.loads((tmp_path / "plugin.json").read_text())
    assert plugin["cpu_shims"] is False
    manifest = engine.manifest(["hicache-diag", "run"])
    assert manifest["device"] == "cuda"
    assert manifest["sglang"]["cuda"] == {
        "torch": "2.9.1+cu128",
        "cuda": "12.8",
        "count": 2,
        "gpus": ["H100", "H100"],
    }


def test_a_cpu_launch_keeps_its_flags_and_its_manifest_says_cpu(tmp_path, monkeypatch):
    cfg = SglangRunConfig(
        spec=LaunchSpec(model=tmp_path / "model"),
        workload=WorkloadConfig("shared-prefix", 4, 2, 0),
        python=PY,
        sglang_version="0.5.23",
        hang_timeout=5.0,
    )
    assert cfg.spec.argv(PY, 1)[-len(CPU_ARGS) :] == CPU_ARGS

    class Server:
        port = 1

    monkeypatch.setattr(sglang_trial, "make_server", lambda *a, **k: Server())
    engine = sglang_trial.SglangEngine(cfg)
    engine.prepare(tmp_path)
    assert json.loads((tmp_path / "plugin.json").read_text())["cpu_shims"] is True
    manifest = engine.manifest(["hicache-diag", "run"])
    assert manifest["device"] == "cpu" and "cuda" not in manifest["sglang"]
