"""Every bench script imports and answers --help from the project root (issue 14: a bench named
like a stdlib module, `bench/bisect.py`, once shadowed `bisect` and broke `bench/ttr.py`)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "bench").glob("*.py"))
STDLIB = set(sys.stdlib_module_names)


def test_there_are_bench_scripts() -> None:
    assert len(SCRIPTS) >= 5, [p.name for p in SCRIPTS]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_no_bench_script_shadows_a_stdlib_module(script: Path) -> None:
    # `python bench/x.py` puts bench/ first on sys.path, so bench/bisect.py would be `bisect`.
    assert script.stem not in STDLIB, f"bench/{script.name} shadows the stdlib module {script.stem}"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_bench_script_imports(script: Path) -> None:
    spec = importlib.util.spec_from_file_location(f"bench_{script.stem}", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # module level only: main() is behind __name__ == "__main__"
    assert callable(getattr(module, "main", None)), f"{script.name} has no main()"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_bench_script_help_from_the_project_root(script: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(script.relative_to(ROOT)), "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "usage:" in proc.stdout, proc.stdout[:500]


def _our_imports(script: Path) -> list[tuple[int, str, str | None]]:
    """(line, module, name) for every import of ours, deferred ones inside functions included."""
    found: list[tuple[int, str, str | None]] = []
    for node in ast.walk(ast.parse(script.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hicache_diag"):
            found += [(node.lineno, node.module, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            found += [
                (node.lineno, a.name, None) for a in node.names if a.name.startswith("hicache_diag")
            ]
    return found


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_bench_script_deferred_imports_resolve(script: Path) -> None:
    # A bench imports the tool inside main() to keep --help fast, so --help never sees a moved name
    # (bench/record_overhead.py asked options.run_options for SglangOptions after the house cut).
    missing = []
    for line, module, name in _our_imports(script):
        mod = importlib.import_module(module)
        if name and not hasattr(mod, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                missing.append(f"bench/{script.name}:{line}: {module}.{name}")
    assert not missing, missing
