"""One export: a run directory -> the test, the launch script and requests, and REPORT.md."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from string import Template

from hicache_diag.errors import RunDirError
from hicache_diag.export import launch, report
from hicache_diag.export.case import Case, load_case
from hicache_diag.export.evidence_tags import run_tags
from hicache_diag.export.recipes import RECIPES, Recipe, find_recipe
from hicache_diag.export.source_lines import present
from hicache_diag.export.trees import install_command, releases, run_release

TEMPLATES = Path(__file__).parent / "templates"
# When the run recorded no backup on PP0 (older recorder): a one-page write into a roomy pool.
DEFAULT_NUMBERS = {"kv_tokens": 8, "leader_host_free": 64}
# Written by hand beside an export (never by export): REPORT.md describes the ones there.
HAND_MADE = ("nonfix.patch", "fix.patch")


@dataclass(frozen=True, slots=True)
class Exported:
    out: Path
    recipe: Recipe
    test: Path
    files: tuple[Path, ...]
    version: str
    lines_from: Path | None  # the release source the report's file:line came from


def _recipe(case: Case, package: Path | None) -> Recipe:
    def shape(recipe: Recipe) -> bool:
        return not case.faults and package is not None and present(package, recipe.steps)

    tags = frozenset(run_tags(case.run_dir))
    crash = (case.form, case.function, case.file, case.failed_pp, case.storage)
    recipe = find_recipe(*crash, shape, tags, cache=case.cache_class)
    other = find_recipe(*crash, shape, tags) if recipe is None else None
    if other is not None:
        raise RunDirError(
            f"{case.run_dir}: the run's ranks ran {case.cache_class}, but the recipe it matches "
            f"({other.name}) drives {other.cache_class}: no export for this mechanism in "
            f"{case.cache_class}"
        )
    if (
        recipe is None
        and package is None
        and any(r.by_source and r.matches(*crash) for r in RECIPES)
    ):
        raise RunDirError(
            f"{case.run_dir}: export reads SGLang {case.version}'s source to pick a recipe and "
            f"quote file:line, and none is here; install it with "
            f"`{install_command(case.version)}` (or unzip its wheel under "
            "$HICACHE_DIAG_SGLANG_RELEASES)"
        )
    if recipe is None:
        known = "; ".join(r.describe() for r in RECIPES)
        l3 = "with" if case.storage else "without"
        raise RunDirError(
            f"{case.run_dir}: no export for form {case.form} in "
            f"{case.function} ({case.file}) on PP{case.failed_pp}, {l3} L3; "
            f"export knows: {known}"
        )
    return recipe


def test_source(case: Case, recipe: Recipe) -> str:
    values = {
        "version": case.version,
        "run_name": case.run_dir.name,
        "failed_pp": case.failed_pp,
        "signature": case.signature or recipe.error,
        "test_file": recipe.test_file,
        "function": case.function,
    }
    values.update(DEFAULT_NUMBERS)
    tags = run_tags(case.run_dir)
    said = [tags[name].says for name in recipe.evidence if name in tags]
    values["evidence_line"] = "; ".join(said) or "see REPORT.md"
    values.update(case.numbers)
    for name in recipe.evidence:  # what the run's evidence measured wins over the defaults
        values.update(tags[name].values if name in tags else {})
    return Template((TEMPLATES / recipe.template).read_text()).substitute(values)


def export_run(run_dir: Path, out: Path, force: bool = False) -> Exported:
    """Every file is claimed (output_paths.py: nothing existing replaced without `force`, a run's
    evidence never) before the first is written, each written atomically."""
    from hicache_diag.evidence.output_paths import claim_dir, write_atomic

    case = load_case(run_dir)
    known = ["launch.sh", "send_requests.py", "requests.json", "REPORT.md"]
    known += ["model_config.json"] if case.model_config else []
    claim_dir("--out", out, tuple(known), force)  # before any interpreter is probed
    package = run_release(case.version, case.python)
    recipe = _recipe(case, package)
    files = {recipe.test_file: test_source(case, recipe), **launch.contents(case, recipe.title)}
    files["conftest.py"] = (TEMPLATES / "conftest.py.tmpl").read_text()
    if case.model_config:
        files["model_config.json"] = json.dumps(case.model_config, indent=2) + "\n"
    names = {"test": recipe.test_file, "launch": "launch.sh", "requests": "requests.json"}
    patches = frozenset(p for p in HAND_MADE if (out / p).is_file())
    files["REPORT.md"] = report.render(case, recipe, package, releases(), names, patches)
    claim_dir("--out", out, tuple(files), force)  # and the recipe's test file
    written = [write_atomic(out / name, text) for name, text in files.items()]
    (out / "launch.sh").chmod(0o755)
    return Exported(out, recipe, out / recipe.test_file, tuple(written), case.version, package)
