"""`--patch FILE`: a release's `sglang` package with a unified diff applied, for one launch.

The installed release is never touched. The overlay is a tree under the tool's cache that
mirrors the release's `sglang/` with symlinks: only the directories on the way to a patched
file are real, only the patched files are copies, and patch(1) rewrites those copies. The
launch puts the overlay first on its PYTHONPATH, so `import sglang` (in every process SGLang
spawns) finds it before site-packages. It is built once per (release, patch content): the key
is the patch's sha256 and the release's version and place. A patch that does not apply to the
release is refused before launch, naming the first file patch(1) rejected.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from hicache_diag.engines.sglang.cache import build_once, cache_root
from hicache_diag.errors import UsageError
from hicache_diag.evidence import files

# "none" as a bisect axis value: the release as it is (`--switch patch=none,fix.patch`).
NO_PATCH = "none"
MAX_PATCH_BYTES = files.MAX_JSON_BYTES  # a diff of the whole sglang package is a few MiB
_MARKER = "overlay.json"
_TARGET = re.compile(r"^\+\+\+ (?:b/)?(\S+)")


@dataclass(frozen=True, slots=True)
class PatchOverlay:
    patch: Path  # the patch file as given, resolved
    sha256: str
    version: str  # the release it was applied to
    root: Path  # holds `sglang/`: the launch's first PYTHONPATH entry
    files: tuple[str, ...]  # the patched files, as `sglang/...`

    def facts(self) -> dict:
        """What the manifest says of the patch."""
        return {
            "file": str(self.patch),
            "sha256": self.sha256,
            "files": list(self.files),
            "overlay": str(self.root),
        }


def patch_targets(text: str) -> tuple[str, ...]:
    """The files a unified diff writes (its `+++` lines, `-p1`), in order, each once."""
    found = [m.group(1) for line in text.splitlines() if (m := _TARGET.match(line))]
    return tuple(dict.fromkeys(t for t in found if t != "/dev/null"))


def check_patch_file(path: str, how: str) -> Path:
    """The patch file, resolved; UsageError (one line) when it is no readable diff."""
    file = Path(path).expanduser()
    try:  # a regular file, bounded: a FIFO never blocks, /dev/zero never fills memory
        text = files.read_bytes(file, MAX_PATCH_BYTES).decode()
    except FileNotFoundError:
        raise UsageError(
            f"{how} {path}: no such file (give a unified diff, or {NO_PATCH})"
        ) from None
    except OSError as exc:  # a symlink loop, a name too long, a file on the way
        raise UsageError(f"{how} {path}: cannot read it ({exc.strerror or exc})") from None
    except ValueError as exc:  # not a regular file, too large, not UTF-8
        raise UsageError(f"{how} {path}: cannot read it ({exc})") from None
    targets = patch_targets(text)
    if not targets:
        raise UsageError(f"{how} {path}: no unified diff in it (no '+++ b/sglang/...' line)")
    outside = [t for t in targets if not t.startswith("sglang/") or ".." in Path(t).parts]
    if outside:
        raise UsageError(
            f"{how} {path}: it patches {outside[0]}, outside the release's sglang/ package "
            "(paths as `patch -p1` reads them from site-packages: a/sglang/..., b/sglang/...)"
        )
    return file.resolve()


def patch_overlay(path: str, version: str, package_dir: Path, how: str = "--patch") -> PatchOverlay:
    """The overlay of release `version` (its `sglang/` at `package_dir`) with the patch at
    `path` applied, built on first use; UsageError when the patch does not apply."""
    file = check_patch_file(path, how)
    data = files.read_bytes(file, MAX_PATCH_BYTES)
    sha = hashlib.sha256(data).hexdigest()
    release = Path(package_dir).resolve()
    where = hashlib.sha256(str(release).encode()).hexdigest()[:8]
    targets = patch_targets(data.decode())
    root = cache_root() / "patched" / f"sglang-{version}-{where}-{sha[:16]}"

    def build(out: Path) -> None:
        _mirror(release, out / "sglang", targets)
        _apply(file, out, f"{how} {path}", version)
        record = {"version": version, "release": str(release), "sha256": sha, "files": targets}
        (out / _MARKER).write_text(json.dumps(record, indent=1) + "\n")

    build_once(root, build, marker=_MARKER)
    return PatchOverlay(file, sha, version, root, targets)


def _mirror(release: Path, top: Path, targets: tuple[str, ...]) -> None:
    """`top` as the release's package: symlinks, except a real directory on the way to each
    target and a copy of each target that exists in the release (patch(1) then edits it)."""
    top.mkdir(parents=True)
    _link_children(release, top)
    for target in targets:
        parts = Path(target).parts[1:]  # below sglang/
        here, src = top, release
        for part in parts[:-1]:
            here, src = here / part, src / part
            if here.is_symlink():
                here.unlink()
                here.mkdir()
                _link_children(src, here)
            elif not here.exists():  # a directory the patch creates
                here.mkdir()
        name = parts[-1]
        if (here / name).is_symlink():
            (here / name).unlink()
            shutil.copyfile(src / name, here / name)


def _link_children(src: Path, dst: Path) -> None:
    for child in src.iterdir():
        if child.name != "__pycache__":
            (dst / child.name).symlink_to(child)


def _apply(patch: Path, root: Path, what: str, version: str) -> None:
    """patch(1) -p1 in `root`; --forward so a patch already in the release is refused too."""
    argv = ["patch", "-p1", "--forward", "--batch", "--no-backup-if-mismatch", "-s"]
    try:
        done = subprocess.run(
            [*argv, "-d", str(root), "-i", str(patch)], capture_output=True, text=True, timeout=60
        )
    except FileNotFoundError:
        raise UsageError(f"{what}: patch(1) is not installed on this host") from None
    if done.returncode != 0:
        said = [ln.strip() for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
        first = next((ln for ln in said if "FAILED" in ln or "can't find" in ln), None)
        raise UsageError(
            f"{what} does not apply to sglang {version}: "
            f"{first or (said[0] if said else 'patch exited ' + str(done.returncode))}"
        )
