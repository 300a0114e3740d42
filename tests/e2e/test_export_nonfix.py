"""The committed exports (samples/exports/<finding>/) against the installed SGLang 0.5.23:
each exported test fails on the release as it is, and still fails with its committed
`nonfix.patch` (the obvious wrong fix) applied to a copy of the release's source. Run with
plain pytest in the release's own interpreter (the venv's base Python), cwd the export (its
conftest.py neutralises a torchvision wheel built for another torch), nothing of ours on the
path. Slow: each run imports SGLang (about a minute on a loaded 2-core host)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.pytest_shim import pytest_only

ROOT = Path(__file__).resolve().parents[2]
EXPORTS = ROOT / "samples" / "exports"
TESTS = {
    "session-reap": "test_session_reap_rank_symmetry.py",
    "flush-deadline": "test_deferred_flush_rank_symmetry.py",
    "write-through-form-a": "test_write_through_rank_symmetry.py",
    "write-through-form-b": "test_write_through_rank_symmetry.py",
    "write-through-form-c-tp": "test_write_through_rank_symmetry.py",
}
PYTHON = getattr(sys, "_base_executable", None) or sys.executable


def _release_dir() -> Path | None:
    ran = subprocess.run(
        [
            PYTHON,
            "-c",
            "import importlib.util as u, sys; s = u.find_spec("
            "'sglang'); print(s.submodule_search_locations[0] if s else '')",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    path = ran.stdout.strip()
    if not path or not (Path(path) / "_version.py").is_file():
        return None
    text = (Path(path) / "_version.py").read_text()
    return Path(path) if "'0.5.23'" in text or '"0.5.23"' in text else None


RELEASE = _release_dir()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.process,
    pytest.mark.skipif(RELEASE is None, reason=f"needs SGLang 0.5.23 for {PYTHON}"),
]


def _copy_exports(tmp: Path) -> Path:
    out = tmp / "exports"
    for finding in TESTS:
        shutil.copytree(EXPORTS / finding, out / finding)
    return out


def _patched_release(tmp: Path, finding: str) -> Path:
    """A copy of the release (symlinks, the patched file real) with this finding's non-fix
    applied (one copy per finding: the write-through non-fixes edit the same lines)."""
    root = tmp / "nonfix" / finding
    shutil.copytree(
        RELEASE,
        root / "sglang",
        symlinks=True,
        copy_function=os.symlink,
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    patch = EXPORTS / finding / "nonfix.patch"
    for line in patch.read_text().splitlines():
        if line.startswith("+++ b/"):
            target = root / line.removeprefix("+++ b/")
            target.unlink()
            shutil.copyfile(RELEASE.parent / line.removeprefix("+++ b/"), target)
    done = subprocess.run(
        ["patch", "-p1", "-d", str(root), "-i", str(patch)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return root


def _pytest(exports: Path, pythonpath: str, findings=tuple(TESTS)) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HICACHE_DIAG", "VIRTUAL"))}
    env.update(PYTHONPATH=pythonpath, PYTHONDONTWRITEBYTECODE="1", PYTHONNOUSERSITE="1")
    files = [str(exports / f / TESTS[f]) for f in findings]
    argv = [PYTHON, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider", "-W", "ignore"]
    # the write-through exports share a test file name (one recipe): import each by its path
    argv += ["--import-mode=importlib", "--rootdir", str(exports), *files]
    ran = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=exports, env=env)
    return ran.stdout + ran.stderr


def _failed(text: str, finding: str) -> list[str]:
    where = f"{finding}/{TESTS[finding]}::"
    return [ln for ln in text.splitlines() if ln.startswith("FAILED ") and where in ln]


def test_exported_tests_fail_on_the_release_and_under_their_non_fixes(tmp_path):
    exports = _copy_exports(tmp_path)
    on_release = _pytest(exports, "")
    for finding in TESTS:
        assert _failed(on_release, finding), (finding, on_release[-4000:])
    assert "IndexError: pop from empty list" in on_release  # the PP follower short (form B)
    assert "sglang" not in [p.name for p in exports.iterdir()]

    said = {}
    for finding in TESTS:
        said[finding] = _pytest(exports, str(_patched_release(tmp_path, finding)), (finding,))
        assert _failed(said[finding], finding), (finding, said[finding][-4000:])
    # The non-fixes hide the symptom; the invariants still see the state apart.
    assert "IndexError: pop from empty list" not in said["write-through-form-b"]
    # (being backed up, backed up to host, host slots taken, device tokens locked)
    assert "PP0 ([], [2], 56, 0), PP1 ([], [], 0, 0)" in said["write-through-form-b"]
    assert "PP0 ([], [], 0, 0), PP1 ([], [2], 56, 0)" in said["write-through-form-a"]
    assert "TP0 ([], [2], 1, 0), TP1 ([], [], 0, 0)" in said["write-through-form-c-tp"]
    # The tick phase reset at the first open: both cases still part.
    failed = "".join(_failed(said["session-reap"], "session-reap"))
    assert "test_timed_out_session_released_at_the_same_step" in failed
    assert "test_deferred_close_released_at_the_same_step" in failed


def _venv(version: str) -> str | None:
    from hicache_diag.engines.sglang.release import venv_python_for

    return venv_python_for(version)


def _run_in(python: str, export: Path, test_file: str, path: list[Path]) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HICACHE_DIAG", "VIRTUAL"))}
    env.update(PYTHONPATH=os.pathsep.join(map(str, path)), PYTHONDONTWRITEBYTECODE="1")
    argv = [python, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider", "-W", "ignore"]
    argv += ["--rootdir", str(export), str(export / test_file)]
    ran = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=export, env=env)
    return ran.stdout + ran.stderr


# finding -> (its test, the affected release, the release with the upstream fix, what the
# affected release's failure says)
OLDER = {
    "waiting-timeout": (
        "test_waiting_timeout_rank_symmetry.py",
        "0.5.19",
        "0.5.20",
        "step 7: PP0 waiting [], PP1 waiting ['o012']",
    ),
    "l3-drain": ("test_pp_storage_control_drain.py", "0.5.18", "0.5.19", "AssertionError: 4 != 0"),
}


def _release_of(python: str) -> Path:
    where = "import importlib.util as u; print(u.find_spec('sglang').submodule_search_locations[0])"
    ran = subprocess.run([python, "-c", where], capture_output=True, text=True, timeout=300)
    return Path(ran.stdout.strip())


def _with_nonfix(release: Path, patch: Path, tmp: Path) -> Path:
    root = tmp / "nonfix"
    shutil.copytree(
        release,
        root / "sglang",
        symlinks=True,
        copy_function=os.symlink,
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    for line in patch.read_text().splitlines():
        if line.startswith("+++ b/sglang/"):
            rel = line.removeprefix("+++ b/sglang/")
            (root / "sglang" / rel).unlink()
            shutil.copyfile(release / rel, root / "sglang" / rel)
    done = subprocess.run(
        ["patch", "-p1", "-d", str(root), "-i", str(patch)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return root


@pytest.mark.parametrize("finding", sorted(OLDER))
def test_older_finding_fails_on_its_release_and_non_fix_and_passes_on_the_fix(finding, tmp_path):
    """The affected release's venv: the export fails as it is and with its non-fix; the fixed
    release's source (from $HICACHE_DIAG_SGLANG_RELEASES or its venv) on the same packages
    passes."""
    from hicache_diag.export.trees import releases

    test_file, affected, fixed, says = OLDER[finding]
    python = _venv(affected)
    if python is None:
        pytest.skip(f"needs $HICACHE_DIAG_SGLANG_VENVS/sglang-{affected}")
    export = tmp_path / finding
    shutil.copytree(EXPORTS / finding, export)
    shim = pytest_only(tmp_path)
    text = _run_in(python, export, test_file, [shim])
    assert "1 failed" in text and says in text, text[-3000:]

    root = _with_nonfix(_release_of(python), EXPORTS / finding / "nonfix.patch", tmp_path)
    text = _run_in(python, export, test_file, [root, shim])
    assert "1 failed" in text and "pop from empty list" not in text, text[-3000:]

    source = releases().get(fixed)
    if source is None:
        pytest.skip(f"{fixed}'s source not at hand for the real-fix half")
    text = _run_in(python, export, test_file, [source.parent, shim])
    assert "1 passed" in text, text[-3000:]
