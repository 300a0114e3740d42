"""Run directory -> pandas frames and parsed side files (docs/evidence.md); tolerant of old runs."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from hicache_diag import evidence as ev
from hicache_diag.diagnosis.logged_facts import with_logged_crashes
from hicache_diag.diagnosis.outputs import DEFAULT_TIE_TOLERANCE, TieTolerance
from hicache_diag.errors import RunDirError
from hicache_diag.evidence import files
from hicache_diag.evidence.stacks import RankDump, parse_dump_text
from hicache_diag.evidence.verdict import Verdict


@dataclass(slots=True)
class RunData:
    """Everything a run directory holds; absent optional files are listed in `missing`."""

    run_dir: Path
    manifest: ev.Manifest  # an empty one when manifest.json is missing (listed in `missing`)
    frames: pd.DataFrame  # one row per (rank, step), sorted by step then rank
    launcher: ev.LauncherRecord | None = None  # sglang: with the facts its log adds
    logs: dict[int, str] = field(default_factory=dict)
    stacks: dict[int, RankDump] = field(default_factory=dict)  # rank -> its saved stack dump
    outputs: Any = None
    reference: Any = None
    verdict: Verdict | None = None
    requests: dict[str, Any] | None = None  # requests.json (real SGLang): per-request errors
    verdict_error: str | None = None  # verdict.json is there but is not a verdict: why
    budget: ev.Budget | None = None  # budget.json: PP0 stopped on --max-steps, work left
    missing: list[str] = field(default_factory=list)
    bad_lines: int = 0  # jsonl lines that did not parse (a torn last line of a killed rank)
    tie_tolerance: float = DEFAULT_TIE_TOLERANCE  # the engine's, for a reference that records none

    @property
    def ranks(self) -> list[int]:
        found = set(self.logs) | set(self.stacks)
        if not self.frames.empty:
            found |= {int(r) for r in self.frames["rank"].unique()}
        found |= {int(entry.rank) for entry in self.manifest.topology_ranks}
        return sorted(found)

    @property
    def evidence_version(self) -> int:
        return int(self.manifest.evidence_version or 0)

    @property
    def engine(self) -> str | None:
        """`sglang`, or None for the builtin runtime (its manifest names no engine)."""
        return self.manifest.engine

    def rank_frames(self, rank: int) -> pd.DataFrame:
        if self.frames.empty:
            return self.frames
        return self.frames[self.frames["rank"] == rank]


def _read_json(path: Path) -> Any:
    try:
        return ev.read_json(path)
    except (OSError, ValueError) as exc:
        raise RunDirError(f"{path} is unreadable: {exc}") from None


def _record(kind: type[ev.Record], path: Path, data: dict[str, Any]) -> Any:
    """`data` as its record; a key of the wrong type (a hand-edited or damaged file) is damage,
    named in one line."""
    try:
        return kind.from_json(data)
    except ValueError as exc:
        raise RunDirError(f"{path} is damaged: {exc}") from None


def read_step_records(path: Path, rank: int) -> tuple[list[ev.StepRecord], int]:
    """The lines as records (a line without `rank` gets its file's); a torn last line (a rank
    killed mid-write) is skipped and counted. Any other line that is not a JSON object means
    the file is damaged, not torn: say so."""
    records, bad, total = [], [], 0
    try:
        steps = list(ev.read_steps(path))
    except (OSError, ValueError) as exc:  # not a regular file, past the size bound
        raise RunDirError(f"{path} is unreadable: {exc}") from None
    for i, rec in steps:
        total = i + 1
        if rec is None:
            bad.append(i)
        else:
            records.append(rec if rec.rank is not None else _with_rank(rec, rank))
    if bad and bad != [total - 1]:
        raise RunDirError(
            f"{path} is damaged: {len(bad)} of {total} line(s) are not JSON objects "
            f"(first at line {bad[0] + 1}); only a rank's last line may be torn"
        )
    return records, len(bad)


def _with_rank(rec: ev.StepRecord, rank: int) -> ev.StepRecord:
    """A line that does not say who wrote it (an old run's) gets its file's rank."""
    return replace(rec, rank=rank, absent=rec.absent - {"rank"})


def _load_frames(run_dir: Path) -> tuple[pd.DataFrame, int]:
    rows: list[dict[str, Any]] = []
    bad = 0
    for rank, path in ev.rank_files(run_dir, ev.RANK_JSONL_GLOB).items():
        if not _present(path):  # a folder named rank0.jsonl is damage, named in one line
            continue
        got, nbad = read_step_records(path, rank)
        rows.extend(rec.to_json() for rec in got)
        bad += nbad
    if not rows:
        return pd.DataFrame(columns=["rank", "step"]), bad
    df = pd.DataFrame(rows)
    if "step" not in df.columns:
        df["step"] = df.groupby("rank").cumcount()
    return df.sort_values(["step", "rank"], kind="stable").reset_index(drop=True), bad


def _load_rank_files(directory: Path) -> dict[int, Path]:
    found: dict[int, Path] = {}
    if not directory.is_dir():
        return found
    for path in sorted(directory.iterdir()):
        rank = ev.rank_of(path) if path.suffix in (".json", ".txt") else None
        if rank is None or not _present(path) or path.stat().st_size == 0:
            continue  # an empty faulthandler file: that rank was never signalled
        # py-spy JSON wins over the faulthandler text fallback when both exist
        if rank not in found or path.suffix == ".json":
            found[rank] = path
    return found


def _load_stacks(run_dir: Path) -> dict[int, RankDump]:
    """py-spy JSON or faulthandler text, parsed as triage parses them; a file that holds no
    readable stack still counts (an empty dump: "an unreadable stack")."""
    stacks: dict[int, RankDump] = {}
    for rank, path in _load_rank_files(run_dir / ev.STACKS).items():
        text = _text(path, damaged=True)
        if not text.strip():
            continue  # the faulthandler file every rank opens at start, never written
        dumps = parse_dump_text(text, str(path))
        stacks[rank] = dumps[0] if dumps else RankDump(None, None, None, [], str(path))
    return stacks


def _load_logs(run_dir: Path) -> dict[int, str]:
    return {
        rank: _text(path, damaged=True)
        for rank, path in ev.rank_files(run_dir, ev.RANK_LOG_GLOB).items()
        if _present(path)
    }


def _object(path: Path) -> dict[str, Any]:
    data = _read_json(path)
    if not isinstance(data, dict):
        kind = type(data).__name__
        raise RunDirError(f"{path} is damaged: it holds a JSON {kind}, not an object")
    return data


def _empty(path: Path) -> bool:
    try:
        return path.stat().st_size == 0
    except OSError:
        return False


def _present(path: Path) -> bool:
    """A side file that is there; one that is there but not a regular file is damaged."""
    if path.is_file():
        return True
    if path.exists() or path.is_symlink():
        raise RunDirError(f"{path} is damaged: it is not a regular file")
    return False


def _optional(run_dir: Path, name: str, missing: list[str], obj: bool = False) -> Any:
    path = run_dir / name
    if not _present(path):
        missing.append(name)
        return None
    if _empty(path):  # a write cut short (an older tool on a full disk): as good as missing
        missing.append(f"{name} (empty: its write was cut short)")
        return None
    return _object(path) if obj else _read_json(path)


def load_run(run_dir: Path | str, tie_tolerance: TieTolerance | None = None) -> RunData:
    """Read a run directory; RunDirError names what is missing when nothing usable is there.
    `tie_tolerance`: the run's engine's tolerance, by the manifest's engine name.

    Optional files (launcher.json, outputs, stacks) may be absent in older or partial runs."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise RunDirError(f"run directory {run_dir} does not exist")
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir} is not a directory")
    missing: list[str] = []
    manifest = _optional(run_dir, ev.MANIFEST, missing, obj=True)
    frames, bad = _load_frames(run_dir)
    logs = _load_logs(run_dir)
    if not manifest and frames.empty and not logs:
        raise RunDirError(
            f"{run_dir} is not a run directory: missing {ev.MANIFEST}, {ev.RANK_JSONL_GLOB} "
            f"and {ev.RANK_LOG_GLOB}"
        )
    if frames.empty:
        missing.append(ev.RANK_JSONL_GLOB)
    manifest = _record(ev.Manifest, run_dir / ev.MANIFEST, manifest or {})
    data = RunData(run_dir, manifest, frames, logs=logs, bad_lines=bad)
    if tie_tolerance is not None:
        data.tie_tolerance = tie_tolerance(data.engine)
    launcher = _optional(run_dir, ev.LAUNCHER, missing, obj=True)
    if launcher is not None:
        data.launcher = _record(ev.LauncherRecord, run_dir / ev.LAUNCHER, launcher)
    data.outputs = _optional(run_dir, ev.OUTPUTS, missing)
    data.reference = _optional(run_dir, ev.REFERENCE, missing)
    rpath = run_dir / ev.REQUESTS  # only the sglang engine's client writes it
    data.requests = _object(rpath) if _present(rpath) else None
    bpath = run_dir / ev.BUDGET  # only written when the step budget ran out
    data.budget = _record(ev.Budget, bpath, _object(bpath)) if _present(bpath) else None
    data.verdict, data.verdict_error = _read_verdict(run_dir / ev.VERDICT)
    data.stacks = _load_stacks(run_dir)
    data.missing = missing
    # What the logs add to the launcher's view (a rank that raised, a server's teardown): read
    # here, not by the runner, for every engine.
    data.launcher = with_logged_crashes(data.launcher, logs, _text(run_dir / ev.SERVER_LOG))
    return data


def _read_verdict(path: Path) -> tuple[Verdict | None, str | None]:
    """verdict.json as its record, or why it is not one: a damaged verdict is the report's to
    name (or to ignore, with --reclassify)."""
    try:
        data = _object(path) if _present(path) and not _empty(path) else None
    except RunDirError as exc:
        return None, str(exc).removeprefix(f"{path} is ").removeprefix("damaged: ")
    if data is None:
        return None, None
    if "outcome" not in data:
        return None, "it has no outcome"
    try:
        return Verdict.from_json(data), None
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        return None, f"{type(exc).__name__}: {exc}"


def _text(path: Path, damaged: bool = False) -> str:
    """A log or a stack dump, its last files.MAX_TEXT_BYTES (where a crash is), from a regular
    file only. `damaged`: a file that is there but unreadable is said (RunDirError)."""
    try:
        return files.read_text(path)
    except FileNotFoundError:
        return ""  # no server log: nothing in it to read
    except (OSError, ValueError) as exc:
        if damaged:
            raise RunDirError(f"{path} is unreadable: {exc}") from None
        return ""
