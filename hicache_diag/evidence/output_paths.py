"""Where the tool may write, one rule for every command (issue 29.5): a path that does not exist,
a directory where none of the files to write exists yet, or, with `--force`, a user's file
replaced; a run directory's evidence never, whatever flag names it and even with `--force`
(a run is written once, docs/design.md §4). A directory whose mode has no write bit is read-only
even for root. Every write is atomic: a temporary file in the same directory, then os.replace,
so a reader never sees half a file and a refused or failed write leaves the old one whole.
Refusals are one line (UsageError, exit 2), checked before anything is read or started."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from hicache_diag import evidence as ev
from hicache_diag.errors import UsageError
from hicache_diag.evidence import files
from hicache_diag.evidence.claims import claim
from hicache_diag.evidence.paths import kind_of, name_fits, not_empty, parent_writable, reachable

# Every name of docs/evidence.md's layout: what a run dir holds as evidence.
EVIDENCE_NAMES = frozenset(
    {
        ev.MANIFEST,
        ev.LAUNCHER,
        ev.OUTPUTS,
        ev.REFERENCE,
        ev.REQUESTS,
        ev.BUDGET,
        ev.SERVER_LOG,
        ev.PLUGIN,
        ev.SCRIPT,
        ev.VERDICT,
        ev.STACKS,
        ev.FIRST_DIVERGENCE,
        ev.CLEAN_STATE,
    }
)
# Folders of a run dir whose every file is evidence (stacks, consensus blocks, clean proofs).
EVIDENCE_DIRS = frozenset({ev.STACKS, ev.FIRST_DIVERGENCE, ev.CLEAN_STATE})
# What a report writes beside the evidence (report --plots RUN_DIR): anything else in a run dir
# is taken for evidence, a name a newer writer adds included.
REPORT_SUFFIXES = (".md", ".html", ".png")
_RANK_FILE = re.compile(r"^rank\d+\.(jsonl|log)$")
# What makes a directory a run dir: its first file, its last, or a rank's records.
_RUN_MARKS = (ev.MANIFEST, ev.LAUNCHER, ev.VERDICT)


def is_run_dir(path: Path) -> bool:
    try:
        if not path.is_dir():
            return False
        if any((path / name).exists() for name in _RUN_MARKS):
            return True
        return any(_RANK_FILE.match(p.name) for p in path.glob("rank*.*"))
    except OSError:  # a name too long, a loop: no run dir can be there
        return False


def _evidence_here(path: Path) -> bool:
    if is_run_dir(path.parent):
        named = path.name in EVIDENCE_NAMES or _RANK_FILE.match(path.name)
        return bool(named) or not path.name.endswith(REPORT_SUFFIXES)
    # anything under a run dir's stacks/ (first_divergence/, clean_state/)
    return any(a.name in EVIDENCE_DIRS and is_run_dir(a.parent) for a in path.parents)


def evidence_file(path: str | os.PathLike) -> bool:
    """A run dir's evidence, named directly, through a symlink, or through a folder link."""
    p = Path(os.path.abspath(path))
    try:
        real = [p.parent.resolve() / p.name, p.resolve()]
    except (OSError, RuntimeError):  # a symlink loop: it names no file, let the caller say so
        real = []
    return any(_evidence_here(c) for c in (p, *real))


def _refuse_evidence(flag: str, path: Path, name: str | None = None) -> None:
    """`name`: the file inside the folder `path` that would be written."""
    target = path if name is None else path / name
    if evidence_file(target):
        what = f"{str(path)!r} is" if name is None else f"{str(path)!r} would overwrite {name},"
        raise UsageError(
            f"{flag} {what} a run directory's evidence; it is never overwritten (not even "
            "with --force): give another path"
        )


def _read_only(flag: str, path: Path) -> None:
    """The nearest existing folder at or above `path` must have a write bit: a folder a user
    made read-only is refused even for root, whom the kernel would let write."""
    probe = Path(os.path.abspath(path))
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if probe.is_dir() and not probe.stat().st_mode & 0o222:
        raise UsageError(f"{flag} {str(path)!r} is not writable: {probe} is read-only")


def claim_file(flag: str, path: str | os.PathLike | None, force: bool = False) -> Path | None:
    """An output file: new, or an existing user file with --force; never evidence."""
    if path is None:
        return None
    not_empty(flag, path)
    p = Path(path)
    name_fits(flag, p)
    reachable(flag, p)
    claim(flag, p)  # before the checks: a second invocation cannot pass them meanwhile
    _refuse_evidence(flag, p)
    if p.exists() or p.is_symlink():
        mode = p.stat().st_mode if p.exists() else stat.S_IFREG
        if not stat.S_ISREG(mode):
            raise UsageError(f"{flag} {str(path)!r} is {kind_of(mode)}; give a file name")
        if not force:
            raise UsageError(
                f"{flag} {str(path)!r} exists; give a new path, or --force to replace it"
            )
    _read_only(flag, p.parent)
    # Probe the folder: the replacement is a new file there, renamed over the old one.
    parent_writable(flag, p.parent if p.exists() or p.is_symlink() else p)
    return p


def claim_dir(
    flag: str,
    path: str | os.PathLike | None,
    names: tuple[str, ...] = (),
    force: bool = False,
    fresh: bool = False,
    once: str = "a run directory",
) -> Path | None:
    """An output folder for files called `names`: it may hold other files, never one of
    `names` unless --force, never evidence among them. `fresh`: it must be new or empty,
    `once` (a run directory, a saved triage bundle) being written once, whose file names are
    known only as it is written."""
    if path is None:
        return None
    not_empty(flag, path)
    p = Path(path)
    name_fits(flag, p)
    reachable(flag, p)
    claim(flag, p)
    for name in names:
        claim(flag, p / name)
    if p.exists() and not p.is_dir():
        raise UsageError(f"{flag} {str(path)!r} is {kind_of(p.stat().st_mode)}; give a directory")
    _refuse_evidence(flag, p)  # a run dir's stacks/ is evidence as a whole
    if fresh and p.is_dir() and any(p.iterdir()):
        raise UsageError(f"{flag} {str(path)!r} is not empty; {once} is written once")
    for name in names:
        target = p / name
        _refuse_evidence(flag, p, name)
        if (target.exists() or target.is_symlink()) and not force:
            raise UsageError(
                f"{flag} {str(path)!r} already holds {name}; give a new "
                "directory, or --force to replace it"
            )
        if target.is_dir() and not target.is_symlink():
            raise UsageError(f"{flag} {str(path)!r} holds a directory {name}; give another path")
    _read_only(flag, p)
    parent_writable(flag, p)
    return p


def write_atomic(path: Path, data: str | bytes) -> Path:
    """Write `data` to `path` through a temporary file in its folder and os.replace (a symlink
    at `path` is replaced, never followed). Evidence is refused here too: a last guard."""
    _refuse_evidence("output", path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return files.write_atomic(path, data)
