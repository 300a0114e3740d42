"""`run --engine sglang --patch FILE` on real SGLang: every scheduler process imports the patched
overlay, not the installed release, and the run records which patch it ran (slow: one launch).

The patch is made here against this interpreter's own release: one module-level line appended
to `sglang/srt/managers/scheduler.py` that prints a marker with the importing process's pid,
so the server log shows which processes ran the patched file."""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from pathlib import Path

import pytest

from hicache_diag.cli.main import run_cli
from hicache_diag.engines.sglang.release import probe_sglang
from hicache_diag.errors import UsageError
from tests.conftest import assert_no_children

pytestmark = [pytest.mark.slow, pytest.mark.process]

_MARKER = "hicache-diag-patch-marker"
_FILE = "sglang/srt/managers/scheduler.py"


def _marker_patch(package: Path, out: Path) -> Path:
    old = (package / "srt" / "managers" / "scheduler.py").read_text()
    new = old + f'\nimport os as _o, sys as _s; _s.stderr.write(f"{_MARKER} {{_o.getpid()}}\\n")\n'
    diff = difflib.unified_diff(
        old.splitlines(keepends=True),
        new.splitlines(keepends=True),
        fromfile=f"a/{_FILE}",
        tofile=f"b/{_FILE}",
    )
    out.write_text("A marker, for the test: which processes import the patched scheduler.\n\n")
    with out.open("a") as fh:
        fh.writelines(diff)
    return out


def test_every_scheduler_runs_the_patched_release_and_the_manifest_says_which(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("HICACHE_DIAG_SGLANG_READY_TIMEOUT", "900")  # a loaded box starts slowly
    try:
        install = probe_sglang(None)
    except UsageError as exc:
        pytest.skip(f"no SGLang in this interpreter: {exc}")
    release_file = install.package_dir / "srt" / "managers" / "scheduler.py"
    before = release_file.read_bytes()
    patch = _marker_patch(install.package_dir, tmp_path / "marker.patch")
    out = tmp_path / "run"
    argv = ["run", "--engine", "sglang", "--pp", "2", "--requests", "2", "--max-new-tokens", "4"]
    rc = run_cli([*argv, "--patch", str(patch), "--out", str(out), "--json"])
    verdict = out / "verdict.json"
    assert rc == 0, verdict.read_text() if verdict.is_file() else capsys.readouterr()
    assert_no_children()
    log = (out / "server.log").read_text()
    pids = set(re.findall(rf"{_MARKER} (\d+)", log))
    ranks = json.loads((out / "launcher.json").read_text())["ranks"]
    scheduler_pids = {str(r["pid"]) for r in ranks}
    assert len(scheduler_pids) == 2 and scheduler_pids <= pids, (scheduler_pids, pids)
    facts = json.loads((out / "manifest.json").read_text())["sglang"]["patch"]
    assert facts["sha256"] == hashlib.sha256(patch.read_bytes()).hexdigest()
    assert facts["files"] == [_FILE]
    assert release_file.read_bytes() == before  # the installed release is never touched
