"""The built wheel holds every module: build it, install it into a scratch venv, import all.

An editable install imports a subpackage missing from `packages` while the wheel silently drops
it, so only a real wheel proves the explicit package list and the package-dir remap.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Where each importable package's source lives (pyproject's package-dir).
SOURCES = {
    "hicache_diag": ROOT / "hicache_diag",
    "hicache_diag.cli": ROOT / "cli",
    "hicache_diag.faults": ROOT / "faults",
}

IMPORT_ALL = r"""
import importlib, json, sys
# Belt and braces: should the repo's editable finder be active, drop it so imports can only
# come from the wheel in this venv.
sys.meta_path = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
names = json.loads(sys.argv[1])
files = {n: importlib.import_module(n).__file__ for n in names}
print(json.dumps(files))
"""


def expected_modules() -> list[str]:
    names = set()
    for pkg, src in SOURCES.items():
        for path in src.rglob("*.py"):
            rel = path.relative_to(src).with_suffix("")
            if "__pycache__" in rel.parts or (
                pkg == "hicache_diag" and rel.parts[0] in ("cli", "faults")
            ):
                continue
            parts = [p for p in rel.parts if p != "__init__"]
            names.add(".".join([pkg, *parts]))
    return sorted(names)


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("pkg")
    # Build from a copy: other work in the checkout never sees our build/ and egg-info.
    src = tmp / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "dist")
    for name in ("hicache_diag", "cli", "faults"):
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    dist = tmp / "dist"
    # -x: setuptools >= 70 builds wheels without the `wheel` package this box lacks.
    build = [sys.executable, "-m", "build", "--wheel", "--no-isolation", "-x", "--outdir"]
    proc = subprocess.run(
        [*build, str(dist), str(src)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    wheel = next(dist.glob("hicache_diag-*.whl"))
    env_dir = tmp / "venv"
    venv.create(env_dir, system_site_packages=False, with_pip=False)
    py = env_dir / "bin" / "python"
    _see_our_dependencies(py)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(py),
            "install",
            "--no-deps",
            "--no-index",
            "-q",
            str(wheel),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return env_dir, py


def _dependency_dirs() -> list[str]:
    """The site directories this interpreter imports typer, torch & co. from: a venv's own
    site-packages inside a venv (which `system_site_packages=True` would miss: it means the
    *base* interpreter's), the system or user site-packages on a bare Python."""
    return [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages")]


def _see_our_dependencies(py: Path) -> None:
    """A .pth line appends a directory to the scratch venv's sys.path after its own
    site-packages (the wheel wins), and unlike site.addsitedir it runs none of that
    directory's .pth files, so the repo's editable install stays out of the picture."""
    purelib = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    (Path(purelib) / "_hicache_diag_test_deps.pth").write_text("\n".join(_dependency_dirs()))


def test_every_module_imports_from_the_wheel(wheel_venv, tmp_path):
    import json

    env_dir, py = wheel_venv
    names = expected_modules()
    assert "hicache_diag.cli.run" in names and "hicache_diag.faults.spec" in names
    proc = subprocess.run(
        [str(py), "-c", IMPORT_ALL, json.dumps(names)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = json.loads(proc.stdout)
    outside = {n: f for n, f in files.items() if not str(f).startswith(str(env_dir))}
    assert not outside, f"imported from outside the wheel: {outside}"


def test_console_script_is_installed(wheel_venv, tmp_path):
    env_dir, _ = wheel_venv
    script = env_dir / "bin" / "hicache-diag"
    assert script.exists()
