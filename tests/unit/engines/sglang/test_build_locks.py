"""Stale torch JIT-build locks: found, refused before a launch they would block forever, and
removed when our own kill of a server mid-build leaves one (real processes hold the locks)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hicache_diag.engines.sglang import build_locks
from hicache_diag.engines.sglang.release import SglangInstall
from hicache_diag.engines.sglang.server import LaunchSpec, ServerStartError, SglangServer

EXT = "hicache_hash_cpp"  # the extension 0.5.18-0.5.19 build on first insert


def _lock(root: Path, name: str = EXT) -> Path:
    path = root / "py311_cpu" / name / "lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    return path


def _holder(path: Path) -> subprocess.Popen:
    """A live process holding `path` open, as torch's FileBaton holder does while it builds."""
    code = (
        f"import os,time; fd=os.open({str(path)!r}, os.O_RDONLY); "
        "print('held', flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def _package(tmp_path: Path, names: tuple[str, ...] = (EXT,)) -> Path:
    pkg = tmp_path / "sglang"
    (pkg / "srt").mkdir(parents=True)
    body = "".join(f"load(name={n!r})\n" for n in names)
    (pkg / "srt" / "native_hash.py").write_text(body)
    return pkg


def test_extensions_root_follows_torchs_environment(tmp_path: Path) -> None:
    assert build_locks.extensions_root({"TORCH_EXTENSIONS_DIR": "/x"}) == Path("/x")
    assert build_locks.extensions_root({"XDG_CACHE_HOME": "/c"}) == Path("/c/torch_extensions")
    assert build_locks.extensions_root({"HOME": "/h"}) == Path("/h/.cache/torch_extensions")


@pytest.mark.process
def test_a_lock_nobody_holds_is_stale_and_a_held_one_is_not(tmp_path: Path) -> None:
    stale, held = _lock(tmp_path, "a"), _lock(tmp_path, "b")
    proc = _holder(held)
    try:
        assert build_locks.stale_locks(tmp_path) == [stale]
    finally:
        proc.kill()
        proc.wait()
    assert build_locks.stale_locks(tmp_path) == [stale, held]  # its holder is gone


def test_only_locks_of_extensions_the_release_builds_count(tmp_path: Path) -> None:
    ours, other = _lock(tmp_path / "ext"), _lock(tmp_path / "ext", "someone_elses_op")
    pkg = _package(tmp_path)
    assert build_locks.built_by(pkg, [ours, other]) == [ours]
    assert build_locks.built_by(pkg, []) == []


def _server(tmp_path: Path, python: str, ext_root: Path) -> SglangServer:
    install = SglangInstall(python=python, version="0.5.18", package_dir=_package(tmp_path))
    spec = LaunchSpec(model=tmp_path, env=(("TORCH_EXTENSIONS_DIR", str(ext_root)),))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    return SglangServer(install, spec, run_dir)


def test_a_stale_lock_refuses_the_launch_with_its_path(tmp_path: Path) -> None:
    lock = _lock(tmp_path / "ext")
    srv = _server(tmp_path, sys.executable, tmp_path / "ext")
    with pytest.raises(ServerStartError, match="stale torch-extension build lock at .*lock"):
        srv.start(tmp_path / "plugin.json")
    assert srv.popen is None and lock.exists()  # nothing started; the user's file left alone


@pytest.mark.process
def test_a_lock_our_kill_leaves_mid_build_is_removed_on_close(tmp_path: Path) -> None:
    ext = tmp_path / "ext"
    held_by_other = _lock(ext, "someone_elses_op")
    other = _holder(held_by_other)
    # A stand-in "interpreter" that starts a JIT build (takes the lock, holds it) and never ends.
    fake = tmp_path / "python"
    lock = ext / "py311_cpu" / EXT / "lock"
    fake.write_text(
        "#!/bin/sh\n"
        f'exec {sys.executable} -c "import os,time; os.makedirs({str(lock.parent)!r}, '
        f'exist_ok=True); fd=os.open({str(lock)!r}, os.O_CREAT|os.O_EXCL); time.sleep(60)"\n'
    )
    fake.chmod(0o755)
    srv = _server(tmp_path, str(fake), ext)
    try:
        srv.start(tmp_path / "plugin.json")
        deadline = time.time() + 30
        while not lock.exists() and time.time() < deadline:
            time.sleep(0.05)
        assert lock.exists()
        srv.close()
        assert srv.removed_locks == [lock] and not lock.exists()
        assert held_by_other.exists()  # not ours, and held: untouched
    finally:
        srv.close()
        other.kill()
        other.wait()
    assert not os.path.exists(lock)
