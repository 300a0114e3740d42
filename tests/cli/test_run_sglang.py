"""`run --engine sglang` bad input: one line, exit 2, nothing launched (docs/design.md §8)."""

from __future__ import annotations

import json
import stat
import sys

import pytest

from hicache_diag.cli.main import run_cli
from tests.conftest import live_children

pytestmark = pytest.mark.process  # probes an interpreter in a subprocess


def _fake_sglang_python(tmp_path, version_file: bool = False):
    """An interpreter whose `sglang` is an empty package: every hook target is missing."""
    site = tmp_path / "site"
    (site / "sglang").mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text("")
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} "$@"\n')
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    return str(python)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--engine", "nope"], "unknown --engine 'nope'; valid: builtin, sglang"),
        (["--engine", "sglang", "--protocol", "legacy"], "--protocol is a builtin-engine switch"),
        (
            ["--engine", "sglang", "--switch", "ack-count=local"],
            "--switch is a builtin-engine switch",
        ),
        (["--model", "/tmp"], "--model applies to --engine sglang only"),
        (["--engine", "sglang", "--model", "/nonexistent-model"], "not a model directory"),
        (["--engine", "sglang", "--hicache-size", "16MiB"], "whole GiB"),
        (["--engine", "sglang", "--hicache-ratio", "-1"], "--hicache-ratio must be"),
        (["--engine", "sglang", "--hang-timeout", "nan"], "--hang-timeout must be"),
        (["--engine", "sglang", "--tp", "3"], "does not divide the model's 4 attention heads"),
        (["--engine", "sglang", "--pp", "9"], "exceeds the model's 4 layers"),
        (["--engine", "sglang", "--storage-dir", "/tmp/x"], "does nothing without"),
        (["--engine", "sglang", "--sglang-python", "/nonexistent/python"], "cannot run it"),
        (["--patch", "/tmp/x.patch"], "--patch applies to --engine sglang only"),
        (["--engine", "sglang", "--patch", "/nonexistent/fix.patch"], "no such file"),
        (["--engine", "sglang", "--patch", "none,fix.patch"], "--switch patch=none,FILE"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, args, needle):
    rc = run_cli(["run", *args])
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], err
    assert not live_children(), "bad input must not launch anything"


def test_a_release_without_the_hook_targets_is_refused_before_launch(capsys, tmp_path):
    rc = run_cli(["run", "--engine", "sglang", "--sglang-python", _fake_sglang_python(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert "lacks what hicache-diag hooks" in err and "run_scheduler_process" in err, err
    assert len(err.splitlines()) == 1


def test_a_patch_that_does_not_apply_to_the_release_is_refused_before_launch(capsys, tmp_path):
    """The release's own scheduler.py with a hunk whose context is not in it."""
    patch = tmp_path / "stale.patch"
    patch.write_text(
        "--- a/sglang/srt/managers/scheduler.py\n+++ b/sglang/srt/managers/scheduler.py\n"
        "@@ -1,3 +1,3 @@\n no such line in any release\n-nor this one\n+but this\n end\n"
    )
    rc = run_cli(["run", "--engine", "sglang", "--patch", str(patch), "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1, err
    assert "does not apply to sglang" in err and "scheduler.py" in err, err
    assert not (tmp_path / "r").exists() and not live_children()


def test_device_cuda_on_this_cpu_host_is_refused_before_anything_starts(capsys, tmp_path):
    """The release's own torch (here a CPU build) is asked; one line, exit 2, no run dir, no
    process left; under --json the same refusal as one JSON object on stdout."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU host: --device cuda may run here")
    out = tmp_path / "run"
    argv = ["run", "--engine", "sglang", "--device", "cuda", "--out", str(out)]
    assert run_cli(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("hicache-diag: error: --device cuda: torch "), err
    assert f"in {sys.executable} (the release's interpreter)" in err, err
    assert err.endswith("; --pp 2 x --tp 1 needs 2 GPUs"), err
    assert not out.exists() and not live_children()
    assert run_cli([*argv, "--json"]) == 2
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert doc["schema"] == "hicache-diag/error/v1" and doc["exit_code"] == 2
    assert doc["error"] == err.removeprefix("hicache-diag: error: ")
    assert len(captured.err.strip().splitlines()) == 1 and not out.exists()
