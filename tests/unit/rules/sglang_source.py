"""Locate SGLang 0.5.23's source for the fidelity tests: an importable `sglang` (found without
importing it), `HICACHE_DIAG_SGLANG_SRC`, or `pip download --no-deps sglang==0.5.23` unpacked
into a cache folder. None with a reason when none of them works."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import zipfile
from pathlib import Path

VERSION = "0.5.23"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "hicache-diag"


def _installed() -> Path | None:
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))
    return root if (root / "srt").is_dir() else None


def _downloaded() -> tuple[Path | None, str]:
    target = CACHE / f"sglang-{VERSION}"
    if (target / "sglang" / "srt").is_dir():
        return target / "sglang", ""
    wheels = CACHE / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "-q",
        "-d",
        str(wheels),
        f"sglang=={VERSION}",
    ]
    try:
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)
    except (subprocess.SubprocessError, OSError) as exc:
        return None, f"pip download sglang=={VERSION} failed ({type(exc).__name__})"
    found = sorted(wheels.glob(f"sglang-{VERSION}-*.whl"))
    if not found:
        return None, f"pip download gave no sglang-{VERSION} wheel"
    with zipfile.ZipFile(found[0]) as whl:
        whl.extractall(target)
    return target / "sglang", ""


def sglang_source() -> tuple[Path | None, str]:
    if env := os.environ.get("HICACHE_DIAG_SGLANG_SRC"):
        root = Path(env)
        root = root / "sglang" if (root / "sglang" / "srt").is_dir() else root
        if (root / "srt").is_dir():
            return root, ""
    if root := _installed():
        return root, ""
    return _downloaded()
