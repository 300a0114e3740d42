"""Installing and probing a release: requirement filtering, versions, the missing-SGLang error."""

from __future__ import annotations

import os
import stat
import sys

import pytest

from hicache_diag.errors import UsageError
from hicache_diag.sglang.install import cpu_requirements, probe_sglang, torchvision_for

pytestmark = pytest.mark.process  # probes an interpreter in a subprocess

METADATA = """\
Name: sglang
Requires-Dist: aiohttp
Requires-Dist: flashinfer_python[cu13]==0.7.2
Requires-Dist: nvidia-ml-py
Requires-Dist: sglang-kernel==0.4.10
Requires-Dist: torch==2.14.1
Requires-Dist: transformers==5.19.0
Requires-Dist: av==16.1.0; extra == "diffusion"
Requires-Dist: uvicorn>=0.51
"""


def test_cpu_requirements_drop_cuda_only_packages_extras_and_torch():
    assert cpu_requirements(METADATA) == ["aiohttp", "transformers==5.19.0", "uvicorn>=0.51"]


@pytest.mark.parametrize(("torch", "vision"), [("2.13.0+cpu", "0.28.0"), ("2.14.1", "0.29.0")])
def test_torchvision_matches_the_installed_torch(torch, vision):
    assert torchvision_for(torch) == vision


def test_an_interpreter_without_sglang_is_refused_with_the_command_that_fixes_it(tmp_path):
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} -I -S "$@"\n')  # no site-packages
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    with pytest.raises(UsageError, match="SGLang is not installed .* hicache_diag.sglang.install"):
        probe_sglang(str(python))


def test_a_missing_interpreter_is_one_line(tmp_path):
    with pytest.raises(UsageError, match="cannot run it"):
        probe_sglang(os.fspath(tmp_path / "nope"))
