"""samples/exports/ is what `export` writes for each committed finding today: regenerated here
from the committed runs and compared file by file (a stale export fails), plus each finding's
committed non-fix patch and its row in samples/exports/README.md."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hicache_diag.export.export import export_run
from hicache_diag.export.trees import releases, run_release

ROOT = Path(__file__).resolve().parents[3]
EXPORTS = ROOT / "samples" / "exports"
RUNS = ROOT / "samples" / "runs"
# finding -> the committed run it is exported from
FINDINGS = {
    "session-reap": "sglang-0.5.23-session-close",
    "flush-deadline": "sglang-0.5.23-flush-clock",
    "write-through-form-a": "sglang-0.5.23-form-a",
    "write-through-form-b": "sglang-0.5.23-form-b",
    "write-through-form-c-tp": "sglang-0.5.23-form-c-tp",
}
_HAND_MADE = {"nonfix.patch"}


# The older finding's export reads 0.5.19's source and lists 0.5.19 and 0.5.20 in its range:
# exactly those two, taken from $HICACHE_DIAG_SGLANG_RELEASES / _VENVS.
OLDER = {
    "waiting-timeout": ("sglang-0.5.19-waiting-timeout", ("0.5.19", "0.5.20")),
    "l3-drain": ("sglang-0.5.18-l3-no-fault", ("0.5.18", "0.5.19")),
}


def _only(versions: tuple[str, ...], tmp_path: Path) -> Path | None:
    found = releases()
    if not all(v in found for v in versions):
        return None
    root = tmp_path / "releases"
    for v in versions:
        (root / v).mkdir(parents=True)
        (root / v / "sglang").symlink_to(found[v])
    return root


@pytest.mark.process  # finds the release's source by probing this interpreter
@pytest.mark.parametrize("finding", sorted(FINDINGS) + sorted(OLDER))
def test_committed_export_is_what_export_writes_today(finding, tmp_path, monkeypatch):
    if finding in OLDER:
        run, versions = OLDER[finding]
        picked = _only(versions, tmp_path)
        if picked is None:
            pytest.skip(f"needs SGLang {' and '.join(versions)}'s source (unzipped wheels)")
        monkeypatch.setenv("HICACHE_DIAG_SGLANG_RELEASES", str(picked))
        monkeypatch.delenv("HICACHE_DIAG_SGLANG_VENVS", raising=False)
    else:
        run = FINDINGS[finding]
        for name in ("HICACHE_DIAG_SGLANG_RELEASES", "HICACHE_DIAG_SGLANG_VENVS"):
            monkeypatch.delenv(name, raising=False)
        if run_release("0.5.23", None) is None:
            pytest.skip("the committed exports quote file:line from SGLang 0.5.23's source")
    done = export_run(RUNS / run, tmp_path / finding)
    committed = EXPORTS / finding
    written = {p.name for p in done.files}
    assert written == {p.name for p in committed.iterdir()} - _HAND_MADE
    for name in sorted(written):
        want = (tmp_path / finding / name).read_text()
        assert (committed / name).read_text() == want, (
            f"samples/exports/{finding}/{name} is stale: regenerate with `hicache-diag export "
            f"samples/runs/{run} --out samples/exports/{finding}`"
        )


@pytest.mark.parametrize("finding", sorted(FINDINGS) + sorted(OLDER))
def test_each_exported_run_records_its_models_config(finding):
    """Else export reads the model dir the manifest names, if this machine has it: the
    committed export (model_config.json, REPORT.md's model line) then depends on the machine."""
    run = FINDINGS.get(finding) or OLDER[finding][0]
    manifest = json.loads((RUNS / run / "manifest.json").read_text())
    assert manifest["config"].get("model_config"), f"samples/runs/{run}: no model_config"
    assert (EXPORTS / finding / "model_config.json").is_file()


@pytest.mark.parametrize("finding", sorted(FINDINGS) + sorted(OLDER))
def test_each_finding_has_a_non_fix_patch_and_a_readme_row(finding):
    patch = (EXPORTS / finding / "nonfix.patch").read_text()
    assert patch.startswith("--- a/sglang/srt/") and "\n+++ b/sglang/srt/" in patch
    readme = (EXPORTS / "README.md").read_text()
    assert f"| `{finding}/` |" in readme
