"""samples/exports/ and the hunts' samples/hunt/*/exports/ are what `export` writes for each
committed finding today: regenerated here from the committed runs and compared file by file (a
stale export fails), plus each finding's committed non-fix patch and its row in
samples/exports/README.md."""

from __future__ import annotations

import json
import shutil
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
_HAND_MADE = {"nonfix.patch", "fix.patch", "revert.yaml"}
HUNTS = ROOT / "samples" / "hunt"
# The hunt exported these from a shrink's last failing run, which is not committed (only each
# trigger's first failing run is): kept as the hunt wrote them, not regenerated here.
FROM_SHRINKS = {
    "sglang-0.5.23-60m/flush-deadline",
    "sglang-0.5.23-60m/host-pool",
}
# A hunt on an older release exported with exactly these releases' source (their range table).
HUNT_RELEASES = {"sglang-0.5.18": ("0.5.18", "0.5.19", "0.5.20")}


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
    _assert_exported_today(RUNS / run, EXPORTS / finding, tmp_path / finding)


def _assert_exported_today(run: Path, committed: Path, out: Path) -> None:
    out.mkdir(parents=True)
    for name in _HAND_MADE:  # as when regenerated in place: REPORT.md describes them
        if (committed / name).is_file():
            shutil.copyfile(committed / name, out / name)
    done = export_run(run, out)
    written = {p.name for p in done.files}
    assert written == {p.name for p in committed.iterdir()} - _HAND_MADE
    for name in sorted(written):
        assert (committed / name).read_text() == (out / name).read_text(), (
            f"{committed.relative_to(ROOT)}/{name} is stale: regenerate with `hicache-diag "
            f"export {run.relative_to(ROOT)} --out {committed.relative_to(ROOT)}`"
        )


def _hunt_exports() -> dict[str, tuple[str, bool]]:
    """ "<hunt>/<trigger>" -> (its first failing run, exported from a shrink's run) for each
    trigger whose hunt.json names an export committed here."""
    out = {}
    for hunt_json in sorted(HUNTS.glob("*/hunt.json")):
        for entry in json.loads(hunt_json.read_text())["results"]:
            if entry.get("export") and (ROOT / entry["export"]).is_dir():
                key = f"{hunt_json.parent.name}/{entry['trigger']}"
                out[key] = (entry["first_failure"], entry.get("shrunk") is not None)
    return out


def test_every_hunt_export_is_checked_or_from_a_shrink_not_committed():
    found = {f"{p.parent.parent.name}/{p.name}" for p in HUNTS.glob("*/exports/*")}
    assert found == set(_hunt_exports())
    assert {k for k, (_, shrunk) in _hunt_exports().items() if shrunk} == FROM_SHRINKS


@pytest.mark.process  # finds the release's source by probing this interpreter
@pytest.mark.parametrize("export", sorted(set(_hunt_exports()) - FROM_SHRINKS))
def test_committed_hunt_export_is_what_export_writes_today(export, tmp_path, monkeypatch):
    hunt, trigger = export.split("/")
    versions = HUNT_RELEASES.get(hunt)
    picked = _only(versions, tmp_path) if versions else None
    for name in ("HICACHE_DIAG_SGLANG_RELEASES", "HICACHE_DIAG_SGLANG_VENVS"):
        monkeypatch.delenv(name, raising=False)
    if versions:
        if picked is None:
            pytest.skip(f"needs SGLang {', '.join(versions)}'s source (unzipped wheels or venvs)")
        monkeypatch.setenv("HICACHE_DIAG_SGLANG_RELEASES", str(picked))
    elif run_release("0.5.23", None) is None:
        pytest.skip("the committed hunt exports quote file:line from SGLang 0.5.23's source")
    run = ROOT / _hunt_exports()[export][0]
    _assert_exported_today(run, HUNTS / hunt / "exports" / trigger, tmp_path / trigger)


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
