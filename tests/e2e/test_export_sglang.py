"""`hicache-diag export` end to end: the CLI on the committed 0.5.23 form-B run, then the
exported test run by a separate plain pytest against the installed SGLang, where it must fail
the way the run did (`IndexError: pop from empty list` in `writing_check`).

The exported file imports nothing of ours. One thing is this host's, not the test's: the only
torchvision wheel for a CPU torch is a CUDA build whose fake-kernel registrations fail at
`import sglang` (docs/sglang-on-cpu.md); the subprocess empties that one module first, as our
SGLang launches do. On a GPU host `python -m pytest -q <file>` is all it takes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.pytest_shim import pytest_only

ROOT = Path(__file__).resolve().parents[2]
FORM_B = ROOT / "samples" / "runs" / "sglang-0.5.23-form-b"
CLI = [sys.executable, "-m", "hicache_diag.cli.main"]
# This host's torchvision (see the docstring); not part of the exported test.
PYTEST = (
    "import sys, types; sys.modules['torchvision._meta_registrations'] = "
    "types.ModuleType('torchvision._meta_registrations'); import pytest; "
    "raise SystemExit(pytest.main(sys.argv[1:]))"
)


def _sglang_version() -> str | None:
    from hicache_diag.engines.sglang.release import probe_sglang
    from hicache_diag.errors import UsageError

    try:
        return probe_sglang().version
    except UsageError:
        return None


_version = _sglang_version()
if _version is None and os.environ.get("CI") == "true":
    raise RuntimeError("CI must run the exported test against the installed SGLang")
pytestmark = [
    pytest.mark.process,
    pytest.mark.skipif(_version != "0.5.23", reason=f"needs SGLang 0.5.23 (found {_version})"),
]


def test_exported_form_b_test_fails_on_0_5_23_as_the_run_did(tmp_path):
    out = tmp_path / "export"
    done = subprocess.run(
        [*CLI, "export", str(FORM_B), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    test = out / "test_write_through_rank_symmetry.py"
    assert str(test) in done.stdout.splitlines()
    report = (out / "REPORT.md").read_text()
    # file:line from the installed release's source, as the run's traceback has it
    assert (
        "`UnifiedRadixCache.writing_check` (sglang/srt/mem_cache/unified_radix_cache.py:3508)"
        in report
    )

    env = {k: v for k, v in os.environ.items() if not k.startswith("HICACHE_DIAG")}
    env["PYTHONPATH"] = ""  # nothing of ours on the path: the export's own imports only
    ran = subprocess.run(
        [
            sys.executable,
            "-c",
            PYTEST,
            "-q",
            "-p",
            "no:cacheprovider",
            "-W",
            "ignore",
            "--rootdir",
            str(out),
            str(test),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=out,
        env=env,
    )
    text = ran.stdout + ran.stderr
    assert ran.returncode == 1, text[-3000:]
    assert "1 failed" in text, text[-3000:]
    assert "IndexError: pop from empty list" in text, text[-3000:]
    # the pop in writing_check raised it: pytest's own frame line, or the rank's traceback the
    # test chains onto the re-raised exception
    assert re.search(
        r'unified_radix_cache\.py(:3508: IndexError|", line 3508, in writing_check)', text
    ), text[-3000:]
    assert "hicache_diag" not in test.read_text()


L3_18 = ROOT / "samples" / "runs" / "sglang-0.5.18-l3-no-fault"


def _venv(version: str) -> str | None:
    from hicache_diag.engines.sglang.release import venv_python_for

    return venv_python_for(version)


@pytest.mark.slow
@pytest.mark.skipif(
    _venv("0.5.18") is None, reason="needs $HICACHE_DIAG_SGLANG_VENVS/sglang-0.5.18"
)
def test_exported_l3_drain_test_fails_on_0_5_18_and_skips_where_hiradix_is_gone(tmp_path):
    """The committed no-fault 0.5.18 L3 hang: its test fails on 0.5.18 (PP1 frees nothing) and
    skips on a release without HiRadixCache (0.5.21, when held). Plain pytest there comes
    from this interpreter's pytest alone on the path (the release venvs hold no pytest)."""
    out = tmp_path / "export"
    done = subprocess.run(
        [*CLI, "export", str(L3_18), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    test = out / "test_pp_storage_control_drain.py"
    shim = pytest_only(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HICACHE_DIAG")}
    env["PYTHONPATH"] = str(shim)
    want = {"0.5.18": ("1 failed", "AssertionError: 4 != 0"), "0.5.21": ("1 skipped", "")}
    for version, (summary, needle) in want.items():
        python = _venv(version)
        if python is None:
            continue
        ran = subprocess.run(
            [
                python,
                "-c",
                PYTEST,
                "-q",
                "-p",
                "no:cacheprovider",
                "-W",
                "ignore",
                "--rootdir",
                str(out),
                str(test),
            ],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=out,
            env=env,
        )
        text = ran.stdout + ran.stderr
        assert summary in text and needle in text, (version, text[-3000:])


def test_a_shrinks_dir_exports_its_shrunk_run(tmp_path):
    """`export SHRINK_DIR` is the export of the shrink's last failing trial (what a hunt hands
    a maintainer after shrinking a perturbation's failure)."""
    shrink = tmp_path / "shrink"
    shrink.mkdir()
    record = {"schema": "hicache-diag/shrink/v1", "last_failing": str(FORM_B), "removed": []}
    (shrink / "shrink.json").write_text(json.dumps(record))
    out = tmp_path / "export"
    done = subprocess.run(
        [*CLI, "export", str(shrink), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert f"the shrunk run {FORM_B}" in done.stderr
    assert (out / "test_write_through_rank_symmetry.py").is_file()  # form B's recipe
    assert f"from run `{FORM_B.name}`" in (out / "REPORT.md").read_text()
