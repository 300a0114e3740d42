"""pytest's own files alone, for a release venv our installer made (it holds no pytest): an
export's test runs there under plain pytest, as a maintainer would run it."""

from __future__ import annotations

from pathlib import Path

import pytest

# pytest, its packages and its top-level `py.py` (pytest 9 imports `py` from its own copy)
PYTEST_FILES = ("pytest", "_pytest", "pluggy", "iniconfig", "py.py")


def pytest_only(tmp: Path) -> Path:
    """A folder for PYTHONPATH holding only pytest's files (links into this interpreter's)."""
    shim = tmp / "pytest-only"
    shim.mkdir()
    site = Path(pytest.__file__).resolve().parents[1]
    for name in PYTEST_FILES:
        (shim / name).symlink_to(site / name)
    return shim
