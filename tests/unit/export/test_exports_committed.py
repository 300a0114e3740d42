"""samples/exports/ is what `export` writes for each committed finding today: regenerated here
from the committed runs and compared file by file (a stale export fails), plus each finding's
committed non-fix patch and its row in samples/exports/README.md."""

from __future__ import annotations

from pathlib import Path

import pytest

from hicache_diag.export.export import export_run
from hicache_diag.export.trees import run_release

ROOT = Path(__file__).resolve().parents[3]
EXPORTS = ROOT / "samples" / "exports"
RUNS = ROOT / "samples" / "runs"
# finding -> the committed run it is exported from
FINDINGS = {
    "session-reap": "sglang-0.5.23-session-close",
    "flush-deadline": "sglang-0.5.23-flush-clock",
    "write-through-form-b": "sglang-0.5.23-form-b",
}
_HAND_MADE = {"nonfix.patch"}


@pytest.mark.process  # finds the release's source by probing this interpreter
@pytest.mark.parametrize("finding", sorted(FINDINGS))
def test_committed_export_is_what_export_writes_today(finding, tmp_path, monkeypatch):
    for name in ("HICACHE_DIAG_SGLANG_RELEASES", "HICACHE_DIAG_SGLANG_VENVS"):
        monkeypatch.delenv(name, raising=False)
    if run_release("0.5.23", None) is None:
        pytest.skip("the committed exports quote file:line from SGLang 0.5.23's source")
    done = export_run(RUNS / FINDINGS[finding], tmp_path / finding)
    committed = EXPORTS / finding
    written = {p.name for p in done.files}
    assert written == {p.name for p in committed.iterdir()} - _HAND_MADE
    for name in sorted(written):
        want = (tmp_path / finding / name).read_text()
        assert (committed / name).read_text() == want, (
            f"samples/exports/{finding}/{name} is stale: regenerate with `hicache-diag export "
            f"samples/runs/{FINDINGS[finding]} --out samples/exports/{finding}`"
        )


@pytest.mark.parametrize("finding", sorted(FINDINGS))
def test_each_finding_has_a_non_fix_patch_and_a_readme_row(finding):
    patch = (EXPORTS / finding / "nonfix.patch").read_text()
    assert patch.startswith("--- a/sglang/srt/") and "\n+++ b/sglang/srt/" in patch
    readme = (EXPORTS / "README.md").read_text()
    assert f"| `{finding}/` |" in readme
