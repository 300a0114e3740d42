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
from hicache_diag.export.trees import releases, run_release

TEMPLATES = Path(__file__).parent / "templates"
# When the run recorded no backup on PP0 (older recorder): a one-page write into a roomy pool.
DEFAULT_NUMBERS = {"kv_tokens": 8, "leader_host_free": 64}


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
    recipe = find_recipe(
        case.form, case.function, case.file, case.failed_pp, case.storage, shape, tags
    )
    if recipe is None:
        known = "; ".join(r.describe() for r in RECIPES)
        l3 = "with" if case.storage else "without"
        raise RunDirError(f"{case.run_dir}: no export for form {case.form} in "
                          f"{case.function} ({case.file}) on PP{case.failed_pp}, {l3} L3; "
                          f"export knows: {known}")  # fmt: skip
    return recipe


def test_source(case: Case, recipe: Recipe) -> str:
    values = {"version": case.version, "run_name": case.run_dir.name,
              "failed_pp": case.failed_pp, "signature": case.signature or recipe.error,
              "test_file": recipe.test_file, "function": case.function}  # fmt: skip
    values.update(DEFAULT_NUMBERS)
    tags = run_tags(case.run_dir)
    said = [tags[name].says for name in recipe.evidence if name in tags]
    values["evidence_line"] = "; ".join(said) or "see REPORT.md"
    values.update(case.numbers)
    return Template((TEMPLATES / recipe.template).read_text()).substitute(values)


def export_run(run_dir: Path, out: Path) -> Exported:
    case = load_case(run_dir)
    package = run_release(case.version, case.python)
    recipe = _recipe(case, package)
    out.mkdir(parents=True, exist_ok=True)
    test = out / recipe.test_file
    test.write_text(test_source(case, recipe))
    conftest = out / "conftest.py"
    conftest.write_text((TEMPLATES / "conftest.py.tmpl").read_text())
    written = [test, conftest, *launch.write(case, out, recipe.title)]
    if case.model_config:
        cfg = out / "model_config.json"
        cfg.write_text(json.dumps(case.model_config, indent=2) + "\n")
        written.append(cfg)
    names = {"test": test.name, "launch": "launch.sh", "requests": "requests.json"}
    md = out / "REPORT.md"
    md.write_text(report.render(case, recipe, package, releases(), names))
    written.append(md)
    return Exported(out, recipe, test, tuple(written), case.version, package)
