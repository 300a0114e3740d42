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
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hicache_diag.engines.sglang.bundle import plugin_bundle
from hicache_diag.engines.sglang.cache import cache_root
from hicache_diag.errors import UsageError
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
    if record_dir.exists() and not record_dir.is_dir():
        raise UsageError(f"--dir {record_dir}: not a directory (it is a file)")
    bundle = plugin_bundle().root
    if bundle_dir is not None:
        bundle = copy_bundle(bundle, Path(os.path.abspath(bundle_dir)))
    variables = {
        "PYTHONPATH": os.pathsep.join([str(bundle / "site"), str(bundle / "lib")]),
        RECORD_DIR_ENV: str(record_dir),
    }
    if cpu_shims:
        variables[CPU_SHIMS_ENV] = "1"
    return RecordSetup(variables, bundle, record_dir)


def copy_bundle(bundle: Path, dest: Path) -> Path:
    """The bundle's files at `dest` (an empty or missing folder, or an older copy of ours)."""
    if dest.is_symlink():
        raise UsageError(f"--bundle-dir {dest}: a symlink; name the folder itself")
    if dest.exists() and not dest.is_dir():
        raise UsageError(f"--bundle-dir {dest}: not a directory (it is a file)")
    if dest.is_dir() and any(dest.iterdir()) and not (dest / _MARKER).is_file():
        raise UsageError(
            f"--bundle-dir {dest}: not empty and not a recorder bundle; name an empty folder"
        )
    scratch = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.copytree(bundle, scratch)
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(scratch, dest)
    return dest
