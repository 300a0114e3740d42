"""The three open 0.5.23 mechanisms' exports against the installed SGLang 0.5.23, through
bench/export_patch_check.py: each test fails on the release as it is and under its
`nonfix.patch`, every hunk of the non-fix is executed by the test (line tracing, forked rank
processes included), and the test passes under `fix.patch`, except form B of the write-through
(a PP follower short of host room), which the fix names at the decision instead. Slow: 15 runs,
each importing SGLang in two processes."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_SPEC = importlib.util.spec_from_file_location(
    "export_patch_check", ROOT / "bench" / "export_patch_check.py"
)
check_module = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(check_module)

# finding -> what its test does under fix.patch
FIX_OUTCOME = {
    "session-reap": "passed",
    "flush-deadline": "passed",
    "write-through-form-a": "passed",
    "write-through-form-c-tp": "passed",
    "write-through-form-b": "failed",
}


def _release() -> Path | None:
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0])
    version = path / "version.py"
    text = version.read_text() if version.is_file() else ""
    text += (path / "_version.py").read_text() if (path / "_version.py").is_file() else ""
    return path if "0.5.23" in text else None


RELEASE = _release()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.process,
    pytest.mark.skipif(RELEASE is None, reason=f"needs SGLang 0.5.23 for {sys.executable}"),
]


@pytest.mark.parametrize("finding", sorted(FIX_OUTCOME))
def test_release_and_non_fix_fail_the_fix_does_not(finding, tmp_path):
    result = check_module.check(finding, RELEASE, tmp_path)
    runs = result["runs"]
    assert runs["release"]["outcome"] == "failed", runs["release"]
    assert runs["nonfix"]["outcome"] == "failed", runs["nonfix"]
    unexecuted = [h for h in runs["nonfix"]["hunks"] if not h["executed"]]
    assert not unexecuted, f"non-fix hunks the test never runs: {unexecuted}"
    assert runs["fix"]["outcome"] == FIX_OUTCOME[finding], runs["fix"]
    if finding == "write-through-form-b":
        assert any("IndexError: pop from empty list" in s for s in runs["release"]["said"])
        assert any("write-through diverged across ranks" in s for s in runs["fix"]["said"])
    else:
        assert result["fix_and_nonfix_differ"]
