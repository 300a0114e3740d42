"""torch's JIT-extension build locks, as SGLang's releases meet them.

SGLang 0.5.18-0.5.19 build a C++ hash extension on first use (`cpp_utils/native_hash.py`,
through `torch.utils.cpp_extension.load`). torch guards the build with a `FileBaton`: the builder
creates `<root>/<py>_<cu|cpu>/<name>/lock` with O_EXCL, keeps the descriptor open while it builds
and removes the file when done; every other process spins on the file with no time limit. A
process killed mid-build (our reaping kills whole process groups) leaves the file behind, and every
later launch of that release then waits forever inside its first insert. So a lock file that no
live process holds open is stale: it can only block.
"""

from __future__ import annotations

import os
from pathlib import Path

import psutil


def extensions_root(env: dict[str, str] | os._Environ[str] | None = None) -> Path:
    """Where torch puts its JIT builds for a process with environment `env`."""
    env = os.environ if env is None else env
    if env.get("TORCH_EXTENSIONS_DIR"):
        return Path(env["TORCH_EXTENSIONS_DIR"])
    cache = env.get("XDG_CACHE_HOME") or os.path.join(env.get("HOME") or str(Path.home()), ".cache")
    return Path(cache) / "torch_extensions"


def find_locks(root: Path) -> set[Path]:
    """Every build lock under `root` (one per extension per interpreter flavour)."""
    if not root.is_dir():
        return set()
    return {p for p in root.glob("*/*/lock") if p.is_file()}


def _held_open() -> set[str]:
    held: set[str] = set()
    for proc in psutil.process_iter():
        try:
            held.update(f.path for f in proc.open_files())
        except psutil.Error:
            continue
    return held


def stale_locks(root: Path, among: set[Path] | None = None) -> list[Path]:
    """Locks under `root` (or only those in `among`) that no live process holds open."""
    locks = find_locks(root) if among is None else {p for p in among if p.is_file()}
    if not locks:
        return []
    held = _held_open()
    return sorted(p for p in locks if str(p) not in held and str(p.resolve()) not in held)


def built_by(package_dir: Path, locks: list[Path]) -> list[Path]:
    """The locks of extensions the release at `package_dir` names in its source (a stale lock of
    some other extension blocks nothing of SGLang's)."""
    names = {lock.parent.name: lock for lock in locks}
    if not names:
        return []
    found: set[str] = set()
    for path in package_dir.rglob("*.py"):
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        found.update(n for n in names if f'"{n}"' in text or f"'{n}'" in text)
        if len(found) == len(names):
            break
    return sorted(names[n] for n in found)


def remove_locks(paths: list[Path]) -> list[Path]:
    """Remove the given stale locks; return those actually removed."""
    removed = []
    for path in paths:
        try:
            path.unlink()
            removed.append(path)
        except FileNotFoundError:
            continue
    return removed


__all__ = ["built_by", "extensions_root", "find_locks", "remove_locks", "stale_locks"]
