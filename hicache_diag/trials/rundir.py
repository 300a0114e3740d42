"""The run directory of docs/evidence.md (ours): layout, manifest.json, config round trip."""

from __future__ import annotations

import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hicache_diag import __version__
from hicache_diag import evidence as ev
from hicache_diag.errors import UsageError

EVIDENCE_VERSION = ev.EVIDENCE_VERSION
utc_now = ev.utc_now


def prepare_run_dir(out: str | None, seed: int) -> Path:
    """`--out` or `runs/<utc>-<seed>/`; raises UsageError (one line) when it is not writable."""
    if out:
        path = Path(out)
        _refuse_non_empty(path)
    else:
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%f")
        path = Path("runs") / f"{stamp}-{seed}"
    try:
        (path / ev.STACKS).mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".probe"):
            pass
    except OSError as exc:
        raise UsageError(f"--out {str(path)!r} is not writable: {exc.strerror or exc}") from None
    return path.resolve()


def _refuse_non_empty(path: Path) -> None:
    """A run directory is written once (docs/design.md §4): never append to another run's
    evidence."""
    if path.is_dir() and any(path.iterdir()):
        raise UsageError(f"--out {str(path)!r} is not empty; a run directory is written once")


def check_writable(out: str | None, flag: str = "--out") -> None:
    """Validate --out without leaving anything behind (bad input must not start anything)."""
    from hicache_diag.evidence.output_paths import claim_dir

    claim_dir(flag, out, fresh=True)  # the one rule of every output path (output_paths.py)


write_json = ev.write_json  # every run-dir JSON file, one format (evidence/record.py)


def manifest_head(argv: list[str]) -> dict[str, Any]:
    """The manifest fields every engine's run dir has (docs/evidence.md)."""
    return ev.Manifest.head(argv, __version__).to_json()


def write_manifest(run_dir: Path, manifest: dict[str, Any] | ev.Manifest) -> None:
    """manifest.json, the one writer (trials/trial.py): what an engine's `manifest()` gave,
    through the one record."""
    if not isinstance(manifest, ev.Manifest):
        manifest = ev.Manifest.from_json(manifest)
    write_json(run_dir / ev.MANIFEST, manifest)


def read_manifest(run_dir: Path) -> ev.Manifest:
    return ev.read_record(ev.Manifest, run_dir / ev.MANIFEST)
