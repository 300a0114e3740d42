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


def test_a_patch_axis_runs_each_cell_on_its_own_server(tmp_path, capsys, monkeypatch):
    """`bisect --switch patch=none,FILE --warm-server`: the patched cell's schedulers import the
    overlay and its manifests carry the patch's sha256; the unpatched cell's never print the
    marker (its server was never the patched one)."""
    try:
        install = probe_sglang(None)
    except UsageError as exc:
        pytest.skip(f"no SGLang in this interpreter: {exc}")
    monkeypatch.setenv("HICACHE_DIAG_SGLANG_READY_TIMEOUT", "900")
    patch = _marker_patch(install.package_dir, tmp_path / "marker.patch")
    out = tmp_path / "bisect"
    argv = ["bisect", "--engine", "sglang", "--pp", "2", "--requests", "2"]
    argv += ["--max-new-tokens", "4", "--switch", f"patch=none,{patch}", "--trials", "1"]
    rc = run_cli([*argv, "--warm-server", "--out", str(out), "--json"])
    table = json.loads(capsys.readouterr().out)
    assert rc == 0, table
    assert_no_children()
    by_patch = {c["values"]["patch"]: c for c in table["cells"]}
    assert by_patch["none"]["trials"] == 1 and by_patch[str(patch)]["trials"] == 1, table
    plain = Path(by_patch["none"]["run_dirs"][0])
    fixed = Path(by_patch[str(patch)]["run_dirs"][0])
    assert _MARKER not in (plain / "server.log").read_text()
    assert _MARKER in (fixed / "server.log").read_text()
    assert "patch" not in json.loads((plain / "manifest.json").read_text())["sglang"]
    facts = json.loads((fixed / "manifest.json").read_text())["sglang"]["patch"]
    assert facts["sha256"] == hashlib.sha256(patch.read_bytes()).hexdigest()
