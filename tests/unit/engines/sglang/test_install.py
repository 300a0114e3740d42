"""Installing and probing a release: requirements decided from metadata, pip's failures read,
versions, the missing-SGLang error."""

from __future__ import annotations

import os
import stat
import sys

import pytest

from hicache_diag.engines.sglang import requirements as R
from hicache_diag.engines.sglang.cpu_install import torchvision_for
from hicache_diag.engines.sglang.release import missing_package_error, probe_sglang
from hicache_diag.errors import UsageError

METADATA = """\
Name: sglang
Requires-Dist: aiohttp
Requires-Dist: flashinfer_python[cu13]==0.7.2
Requires-Dist: nvidia-ml-py
Requires-Dist: nvshmem4py-cu13
Requires-Dist: cuda-tile==1.6.0rc5
Requires-Dist: sglang-kernel==0.4.10
Requires-Dist: torch==2.14.1
Requires-Dist: torchvision
Requires-Dist: transformers==5.19.0
Requires-Dist: av==16.1.0; extra == "diffusion"
Requires-Dist: decord2; sys_platform == "linux" and platform_machine == "aarch64"
Requires-Dist: uvicorn>=0.51
"""
X86 = {
    "sys_platform": "linux",
    "platform_machine": "x86_64",
    "python_version": "3.11",
    "platform_system": "Linux",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "python_full_version": "3.11.7",
    "platform_release": "",
    "platform_version": "",
    "implementation_version": "3.11.7",
}


def test_the_first_cut_reads_names_extras_and_markers_not_a_list():
    plan = R.plan_requirements(R.requires_dist(METADATA), X86)
    # sglang-kernel stays: its own metadata (GPU classifier) decides it, in the next round.
    assert plan.install == [
        "aiohttp",
        "sglang-kernel==0.4.10",
        "transformers==5.19.0",
        "uvicorn>=0.51",
    ]
    why = {d.name: d.reason for d in plan.dropped}
    assert set(why) == {
        "flashinfer_python",
        "nvidia-ml-py",
        "nvshmem4py-cu13",
        "cuda-tile",
        "torch",
        "torchvision",
    }
    assert "CUDA variant [cu13]" in why["flashinfer_python"]
    assert "held at the CPU build" in why["torch"]


def test_a_marker_for_another_machine_keeps_its_requirement_out_and_this_one_in():
    arm = {**X86, "platform_machine": "aarch64"}
    assert "decord2" in R.plan_requirements(R.requires_dist(METADATA), arm).install
    assert "decord2" not in R.plan_requirements(R.requires_dist(METADATA), X86).install


@pytest.mark.parametrize(
    ("meta", "cuda"),
    [
        ({"name": "sglang-kernel", "classifier": ["Environment :: GPU :: NVIDIA CUDA"]}, True),
        ({"name": "quack-kernels", "requires_dist": ["nvidia-cutlass-dsl==4.6.2", "torch"]}, True),
        ({"name": "humming", "requires_dist": ["cuda-bindings"]}, True),
        ({"name": "x", "requires_dist": ["nvidia-cudnn; extra == 'gpu'"]}, False),
        ({"name": "xgrammar", "requires_dist": ["torch>=1.10.0"], "classifier": []}, False),
    ],
)
def test_cuda_only_from_a_packages_own_metadata(meta, cuda):
    assert (R.gpu_only_by_metadata(meta, X86) is not None) is cuda


PLACEHOLDER = """\
Collecting aiohttp (from -r /tmp/r.txt (line 1))
Collecting cuda-tile==1.6.0rc5 (from -r /tmp/r.txt (line 9))
  Downloading cuda_tile-1.6.0rc5.tar.gz (8.4 kB)
  Preparing metadata (pyproject.toml): finished with status 'error'
      You might try installing this package via
      $ pip install --extra-index-url https://pypi.nvidia.com/ cuda-tile
error: metadata-generation-failed
"""
TRANSITIVE = """\
Collecting flashinfer-python==0.6.17 (from -r /tmp/r.txt (line 3))
Collecting cuda-tile>=1.4.0 (from flashinfer-python==0.6.17->-r /tmp/r.txt (line 3))
  Downloading cuda_tile-1.6.0rc5.tar.gz (8.4 kB)
error: metadata-generation-failed
"""


def test_a_placeholder_sdist_is_named_with_who_asked_for_it():
    direct = R.parse_pip_failure(PLACEHOLDER)
    assert direct is not None and direct.package == "cuda-tile" and direct.parents == ()
    assert "pypi.nvidia.com" in direct.reason
    nested = R.parse_pip_failure(TRANSITIVE)
    assert nested is not None and nested.parents == ("flashinfer-python",)


def test_no_distribution_for_this_platform_and_other_failures():
    got = R.parse_pip_failure("ERROR: No matching distribution found for tokenspeed-mla==0.1.8")
    assert got is not None and got.package == "tokenspeed-mla" and "no distribution" in got.reason
    assert R.parse_pip_failure("ERROR: Could not connect to the index") is None


def test_dropping_matches_canonical_names_once():
    plan = R.RequirementPlan(install=["Flash_Attn-4>=4.0"])
    assert plan.drop("flash-attn-4", "why") and plan.install == []
    assert not plan.drop("flash-attn-4", "again")


def test_a_missing_module_in_the_release_is_one_line_naming_it_and_the_fix():
    err = missing_package_error("/v/bin/python", "noise\nmissing-module: tokenizers\n")
    assert err is not None and "'tokenizers'" in str(err) and "--python /v/bin/python" in str(err)
    assert missing_package_error("/v/bin/python", "Traceback ...\nValueError: x") is None


@pytest.mark.parametrize(("torch", "vision"), [("2.13.0+cpu", "0.28.0"), ("2.14.1", "0.29.0")])
def test_torchvision_matches_the_installed_torch(torch, vision):
    assert torchvision_for(torch) == vision


@pytest.mark.process  # probes an interpreter in a subprocess
def test_an_interpreter_without_sglang_is_refused_with_the_command_that_fixes_it(tmp_path):
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} -I -S "$@"\n')  # no site-packages
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    with pytest.raises(
        UsageError, match="SGLang is not installed .* hicache_diag.engines.sglang.install"
    ):
        probe_sglang(str(python))


@pytest.mark.process
def test_a_missing_interpreter_is_one_line(tmp_path):
    with pytest.raises(UsageError, match="cannot run it"):
        probe_sglang(os.fspath(tmp_path / "nope"))
