"""What `hicache-diag record` sets in a launch's environment so that its SGLang processes carry
the recorder (plugin/production.py), and nothing else: the plugin bundle first on PYTHONPATH
(its sitecustomize chains to the image's own) and the recording's variables
(evidence/recording_files.py). The bundle is plain files, standard library only: copied to a
folder of the user's (`--bundle-dir`) it can be mounted into a container or baked into an
image, with no `pip install` of the tool there.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hicache_diag.engines.sglang.bundle import plugin_bundle
from hicache_diag.engines.sglang.cache import cache_root
from hicache_diag.errors import HicacheDiagError, UsageError
from hicache_diag.evidence import paths
from hicache_diag.evidence.claims import claim
from hicache_diag.evidence.recording_files import CPU_SHIMS_ENV, RECORD_DIR_ENV

_MARKER = Path("site") / "sitecustomize.py"  # a folder holding it is a bundle of ours


@dataclass(frozen=True, slots=True)
class RecordSetup:
    """`variables`: what loads the recorder (PYTHONPATH: the bundle's part only); `bundle`: the
    plugin folder they name; `record_dir`: where each launch's session folder goes."""

    variables: dict[str, str]
    bundle: Path
    record_dir: Path

    def environ(self, base: Mapping[str, str]) -> dict[str, str]:
        """`base` with the variables set, the bundle before whatever PYTHONPATH it had."""
        env = {**base, **self.variables}
        if base.get("PYTHONPATH"):
            env["PYTHONPATH"] = os.pathsep.join([self.variables["PYTHONPATH"], base["PYTHONPATH"]])
        return env


def default_record_dir() -> Path:
    return cache_root() / "recordings"


def record_setup(
    record_dir: Path | None, bundle_dir: Path | None = None, cpu_shims: bool = False
) -> RecordSetup:
    """The setup for one record dir; with `bundle_dir`, the bundle is copied there first."""
    record_dir = Path(os.path.abspath(record_dir or default_record_dir()))
    _check_record_dir(record_dir)
    dest = Path(os.path.abspath(bundle_dir)) if bundle_dir is not None else None
    if dest is not None:
        check_bundle_dir(dest)  # before the bundle is built: a refusal costs nothing
    bundle = plugin_bundle().root
    if dest is not None:
        bundle = copy_bundle(bundle, dest)
    variables = {
        "PYTHONPATH": os.pathsep.join([str(bundle / "site"), str(bundle / "lib")]),
        RECORD_DIR_ENV: str(record_dir),
    }
    if cpu_shims:
        variables[CPU_SHIMS_ENV] = "1"
    return RecordSetup(variables, bundle, record_dir)


def _check_record_dir(record_dir: Path) -> None:
    """A folder that is, or can be, there: refused in one line where no process could make it
    (a name too long, a symlink loop, a file on the way). Missing, or not writable here, is
    fine: a manifest (--print-env) may name another host's path."""
    paths.name_fits("--dir", record_dir)
    paths.reachable("--dir", record_dir)
    probe = record_dir
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        kind = paths.kind_of(probe.stat().st_mode)
        if probe == record_dir:
            raise UsageError(f"--dir {record_dir}: not a directory (it is {kind})")
        raise UsageError(f"--dir {record_dir}: cannot be made: {probe} is {kind}")


def check_bundle_dir(dest: Path) -> None:
    """An empty or missing folder, or an older copy of ours, claimed for this process
    (evidence/claims.py: a second `record` on the same folder is refused)."""
    paths.name_fits("--bundle-dir", dest)
    paths.reachable("--bundle-dir", dest)
    claim("--bundle-dir", dest)
    if dest.is_symlink():
        raise UsageError(f"--bundle-dir {dest}: a symlink; name the folder itself")
    if dest.exists() and not dest.is_dir():
        kind = paths.kind_of(dest.stat().st_mode)
        raise UsageError(f"--bundle-dir {dest}: not a directory (it is {kind})")
    if dest.is_dir() and any(dest.iterdir()) and not (dest / _MARKER).is_file():
        raise UsageError(
            f"--bundle-dir {dest}: not empty and not a recorder bundle; name an empty folder"
        )
    paths.parent_writable("--bundle-dir", dest)


def copy_bundle(bundle: Path, dest: Path) -> Path:
    """The bundle's files at `dest` (check_bundle_dir), swapped in whole: a full disk leaves
    the old copy, never half of one."""
    check_bundle_dir(dest)
    try:
        _swap_in(bundle, dest)
    except OSError as exc:
        raise HicacheDiagError(
            f"--bundle-dir {dest}: cannot copy the recorder: {exc.strerror or exc}"
        ) from None
    return dest


def _swap_in(bundle: Path, dest: Path) -> None:
    """Copy into a scratch folder beside `dest`, then rename: the old copy is set aside first
    and put back if the rename fails."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".hicache-diag-bundle-", dir=dest.parent))
    try:
        shutil.copytree(bundle, scratch / "new")
        if dest.exists():
            os.replace(dest, scratch / "old")
        try:
            os.replace(scratch / "new", dest)
        except OSError:
            if (scratch / "old").exists():
                os.replace(scratch / "old", dest)
            raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
