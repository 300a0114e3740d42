"""Releases other than the installed one, each in its own venv made by the installer: a healthy
PP2 L2 run is `ok` with prefill steps recorded, and PP1's host allocs failing from step 200 give
form B, as on 0.5.23 (slow: an install is minutes). A venv missing a requirement is refused
before launch, naming it.

Venvs are reused from `$HICACHE_DIAG_SGLANG_VENVS/sglang-<version>` when that holds them (the
installer checks and repairs them), else made under the test's temporary directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.test_sglang_engine import _lines, assert_no_sglang_left

CLI = [sys.executable, "-m", "hicache_diag.cli.main"]
RELEASES = ("0.5.18", "0.5.21")

pytestmark = [pytest.mark.slow, pytest.mark.process]


def _release_python(version: str, tmp_root: Path) -> str:
    root = Path(os.environ.get("HICACHE_DIAG_SGLANG_VENVS") or tmp_root)
    venv = root / f"sglang-{version}"
    python = venv / "bin" / "python"
    if not python.is_file():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "torch==2.13.0"], check=True)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "hicache_diag.engines.sglang.install",
            "--python",
            str(python),
            "--version",
            version,
        ],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return str(python)


@pytest.fixture(scope="module", params=RELEASES)
def release(request, tmp_path_factory) -> tuple[str, str]:
    return request.param, _release_python(request.param, tmp_path_factory.mktemp("venvs"))


def _run(release_python: str, out: Path, *args: str) -> dict:
    done = subprocess.run(
        [
            *CLI,
            "run",
            "--engine",
            "sglang",
            "--sglang-python",
            release_python,
            "--pp",
            "2",
            "--json",
            "--out",
            str(out),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert_no_sglang_left(out)
    assert done.stdout.strip(), done.stderr[-2000:]
    return json.loads(done.stdout)


def test_a_healthy_run_is_ok_with_prefills_recorded(release, tmp_path):
    version, python = release
    verdict = _run(python, tmp_path / "ok")
    assert verdict["outcome"] == "ok", verdict["evidence"]
    assert not verdict["recorder_errors"]
    manifest = json.loads((tmp_path / "ok" / "manifest.json").read_text())
    assert manifest["sglang"]["version"] == version
    for rank in (0, 1):
        lines = _lines(tmp_path / "ok" / f"rank{rank}.jsonl")
        prefills = [x for x in lines if "extend_num_tokens" in x]
        assert prefills and sum(x["extend_num_tokens"] for x in prefills) > 0
        assert sum(sum(x["prefix_len"].values()) for x in prefills) > 0, "no prefix reuse seen"


def test_pp1_host_allocs_failing_is_form_b(release, tmp_path):
    _, python = release
    verdict = _run(python, tmp_path / "b", "--fault", "host-alloc-fail:rank=1,after=200")
    assert (verdict["outcome"], verdict["form"]) == ("crash", "B"), verdict["evidence"]
    assert verdict["failed_rank"] == 1


def test_a_venv_missing_a_requirement_is_refused_before_launch(release, tmp_path):
    """Uninstall one requirement from a copy's view: the probe reads what is installed, so a
    requirement made to look absent (its dist-info hidden) is named before anything starts."""
    version, python = release
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    info = next(site.glob("xxhash-*.dist-info"))
    hidden = info.with_name(info.name + ".hidden")
    info.rename(hidden)
    try:
        done = subprocess.run(
            [
                *CLI,
                "run",
                "--engine",
                "sglang",
                "--sglang-python",
                python,
                "--out",
                str(tmp_path / "x"),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    finally:
        hidden.rename(info)
    assert done.returncode == 2, done.stderr
    assert "lacks its requirement 'xxhash'" in done.stderr and version in done.stderr
    assert not (tmp_path / "x" / "server.log").exists()
