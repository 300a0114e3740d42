"""`--patch`: the overlay of a release's `sglang/` package (engines/sglang/patch_overlay.py),
built with the real patch(1) on a small stand-in release."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest

from hicache_diag.engines.sglang.patch_overlay import (
    check_patch_file,
    patch_overlay,
    patch_targets,
)
from hicache_diag.errors import UsageError

pytestmark = pytest.mark.process  # runs patch(1)

_SCHED = "def decide(now):\n    return now > 1.0\n\n\ndef other():\n    return 0\n"


@pytest.fixture
def release(tmp_path: Path) -> Path:
    pkg = tmp_path / "site" / "sglang"
    (pkg / "srt" / "managers").mkdir(parents=True)
    (pkg / "srt" / "mem_cache").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "srt" / "__init__.py").write_text("")
    (pkg / "srt" / "managers" / "scheduler.py").write_text(_SCHED)
    (pkg / "srt" / "managers" / "io_struct.py").write_text("X = 1\n")
    (pkg / "srt" / "mem_cache" / "radix.py").write_text("Y = 2\n")
    (pkg / "srt" / "managers" / "__pycache__").mkdir()
    return pkg


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("HICACHE_DIAG_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _diff(rel: str, old: str, new: str) -> str:
    lines = difflib.unified_diff(
        old.splitlines(keepends=True),
        new.splitlines(keepends=True),
        fromfile=f"a/{rel}" if old else "/dev/null",
        tofile=f"b/{rel}",
    )
    return "".join(lines)


def _patch(tmp_path: Path, text: str, name: str = "fix.patch") -> Path:
    path = tmp_path / name
    path.write_text("A header a maintainer reads first.\n\n" + text)
    return path


def test_only_the_patched_files_are_copies_and_the_release_is_untouched(tmp_path, release):
    new = _SCHED.replace("now > 1.0", "now >= 1.0")
    patch = _patch(tmp_path, _diff("sglang/srt/managers/scheduler.py", _SCHED, new))
    overlay = patch_overlay(str(patch), "9.9", release)
    top = overlay.root / "sglang"
    sched = top / "srt" / "managers" / "scheduler.py"
    assert sched.read_text() == new and not sched.is_symlink()
    assert (release / "srt" / "managers" / "scheduler.py").read_text() == _SCHED
    # the way to the patched file is real directories; everything beside it a link
    assert not (top / "srt").is_symlink() and not (top / "srt" / "managers").is_symlink()
    assert (top / "srt" / "mem_cache").is_symlink()
    assert (top / "srt" / "managers" / "io_struct.py").is_symlink()
    assert not (top / "srt" / "managers" / "__pycache__").exists()  # never the release's .pyc
    assert overlay.files == ("sglang/srt/managers/scheduler.py",)
    assert overlay.facts()["sha256"] == overlay.sha256 and len(overlay.sha256) == 64


def test_built_once_per_release_and_patch_content(tmp_path, release):
    new = _SCHED.replace("1.0", "2.0")
    patch = _patch(tmp_path, _diff("sglang/srt/managers/scheduler.py", _SCHED, new))
    first = patch_overlay(str(patch), "9.9", release)
    stamp = (first.root / "overlay.json").stat().st_mtime_ns
    again = patch_overlay(str(patch), "9.9", release)
    assert again.root == first.root
    assert (again.root / "overlay.json").stat().st_mtime_ns == stamp  # not rebuilt
    other = _patch(tmp_path, _diff("sglang/srt/mem_cache/radix.py", "Y = 2\n", "Y = 3\n"), "b.p")
    assert patch_overlay(str(other), "9.9", release).root != first.root
    assert patch_overlay(str(patch), "9.8", release).root != first.root


def test_a_patch_that_does_not_apply_is_refused_and_leaves_nothing(tmp_path, release, cache):
    wrong = _SCHED.replace("other", "elsewhere")
    text = _diff("sglang/srt/managers/scheduler.py", wrong, wrong.replace("0\n", "1\n"))
    patch = _patch(tmp_path, text)
    with pytest.raises(UsageError, match=r"does not apply to sglang 9\.9: .*scheduler\.py"):
        patch_overlay(str(patch), "9.9", release)
    assert not list((cache / "patched").iterdir())
    assert (release / "srt" / "managers" / "scheduler.py").read_text() == _SCHED


def test_a_patch_already_in_the_release_is_refused_not_reversed(tmp_path, release):
    text = _diff("sglang/srt/managers/scheduler.py", "X\n" + _SCHED, _SCHED)
    reverse = _diff("sglang/srt/managers/scheduler.py", _SCHED.replace("1.0", "3.0"), _SCHED)
    for body in (text, reverse):
        with pytest.raises(UsageError, match="does not apply"):
            patch_overlay(str(_patch(tmp_path, body)), "9.9", release)


def test_a_patch_may_add_a_module(tmp_path, release):
    text = _diff("sglang/srt/session/reap.py", "", "Z = 3\n")
    overlay = patch_overlay(str(_patch(tmp_path, text)), "9.9", release)
    assert (overlay.root / "sglang" / "srt" / "session" / "reap.py").read_text() == "Z = 3\n"
    assert not (release / "srt" / "session").exists()


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ("no diff here\n", "no unified diff in it"),
        (_diff("vllm/engine.py", "a\n", "b\n"), "patches vllm/engine.py, outside"),
        (_diff("sglang/../etc/x.py", "a\n", "b\n"), "outside the release's sglang/"),
    ],
)
def test_what_is_not_a_patch_of_the_package_is_one_line(tmp_path, body, needle):
    with pytest.raises(UsageError, match=needle):
        check_patch_file(str(_patch(tmp_path, body)), "--patch")


def test_a_missing_file_names_none(tmp_path):
    with pytest.raises(UsageError, match="no such file .*or none"):
        check_patch_file(str(tmp_path / "nope.patch"), "--patch")


def test_targets_read_from_the_plus_lines():
    text = "--- a/sglang/x.py\n+++ b/sglang/x.py\t2026\n@@ -1 +1 @@\n-a\n+b\n"
    text += "--- /dev/null\n+++ b/sglang/y.py\n@@ -0,0 +1 @@\n+c\n"
    text += "--- a/sglang/x.py\n+++ b/sglang/x.py\n"
    assert patch_targets(text) == ("sglang/x.py", "sglang/y.py")


def test_the_committed_fixes_apply_to_the_installed_release(tmp_path):
    """Each samples/exports/*/fix.patch against this interpreter's SGLang (0.5.23), when it
    has one: the overlay imports nothing, so this is only patch(1) on the real files."""
    import importlib.util

    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("no SGLang in this interpreter")
    package = Path(next(iter(spec.submodule_search_locations)))
    from importlib.metadata import version

    if version("sglang") != "0.5.23":
        pytest.skip(f"the fixes are against 0.5.23, this is {version('sglang')}")
    root = Path(__file__).resolve().parents[4] / "samples" / "exports"
    for patch in sorted(root.glob("*/fix.patch")):
        overlay = patch_overlay(str(patch), "0.5.23", package)
        for rel in overlay.files:
            assert not (overlay.root / rel).is_symlink(), rel
            assert os.path.getsize(overlay.root / rel) > 0
