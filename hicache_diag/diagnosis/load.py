"""Run directory -> pandas frames and parsed side files (docs/evidence.md); tolerant of old runs."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from hicache_diag import evidence as ev
from hicache_diag.diagnosis.logged_facts import with_logged_crashes
from hicache_diag.errors import RunDirError
from hicache_diag.triage.dumps import RankDump, parse_dump_text

_RANK_FILE = re.compile(r"^rank(\d+)\.(jsonl|log)$")
_STACK_FILE = re.compile(r"^rank(\d+)\.(json|txt)$")


@dataclass(slots=True)
class RunData:
    """Everything a run directory holds; absent optional files are listed in `missing`."""

    run_dir: Path
    manifest: dict[str, Any]
    frames: pd.DataFrame  # one row per (rank, step), sorted by step then rank
    launcher: dict[str, Any] | None = None  # sglang: with the facts its log adds (logged_facts)
    logs: dict[int, str] = field(default_factory=dict)
    stacks: dict[int, RankDump] = field(default_factory=dict)  # rank -> its saved stack dump
    outputs: Any = None
    reference: Any = None
    verdict: dict[str, Any] | None = None
    requests: dict[str, Any] | None = None  # requests.json (real SGLang): per-request errors
    verdict_error: str | None = None  # verdict.json is there but unreadable or not an object
    budget: dict[str, Any] | None = None  # budget.json: PP0 stopped on --max-steps, work left
    missing: list[str] = field(default_factory=list)
    bad_lines: int = 0  # jsonl lines that did not parse (a torn last line of a killed rank)

    @property
    def ranks(self) -> list[int]:
        found = set(self.logs) | set(self.stacks)
        if not self.frames.empty:
            found |= {int(r) for r in self.frames["rank"].unique()}
        for entry in self.manifest.get("topology", {}).get("ranks", []) or []:
            found.add(int(entry["rank"]))
        return sorted(found)

    @property
    def evidence_version(self) -> int:
        return int(self.manifest.get("evidence_version", 0) or 0)

    def rank_frames(self, rank: int) -> pd.DataFrame:
        if self.frames.empty:
            return self.frames
        return self.frames[self.frames["rank"] == rank]


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise RunDirError(f"{path} is unreadable: {exc}") from None


def _read_jsonl(path: Path, rank: int) -> tuple[list[dict[str, Any]], int]:
    """The rows; a torn last line (a rank killed mid-write) is skipped and counted. Any other
    line that is not a JSON object means the file is damaged, not torn: say so."""
    rows, bad, lines = [], [], [ln for ln in path.read_text(errors="replace").splitlines()
                                if ln.strip()]  # fmt: skip
    for i, line in enumerate(lines):
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if not isinstance(row, dict):
            bad.append(i)
            continue
        row.setdefault("rank", rank)
        rows.append(row)
    if bad and bad != [len(lines) - 1]:
        raise RunDirError(
            f"{path} is damaged: {len(bad)} of {len(lines)} line(s) are not JSON objects "
            f"(first at line {bad[0] + 1}); only a rank's last line may be torn"
        )
    return rows, len(bad)


def _load_frames(run_dir: Path) -> tuple[pd.DataFrame, int]:
    rows: list[dict[str, Any]] = []
    bad = 0
    for path in sorted(run_dir.glob("rank*.jsonl")):
        m = _RANK_FILE.match(path.name)
        if m and _present(path):  # a folder named rank0.jsonl is damage, named in one line
            got, nbad = _read_jsonl(path, int(m.group(1)))
            rows.extend(got)
            bad += nbad
    if not rows:
        return pd.DataFrame(columns=["rank", "step"]), bad
    df = pd.DataFrame(rows)
    if "step" not in df.columns:
        df["step"] = df.groupby("rank").cumcount()
    return df.sort_values(["step", "rank"], kind="stable").reset_index(drop=True), bad


def _load_rank_files(directory: Path, pattern: re.Pattern[str]) -> dict[int, Path]:
    found: dict[int, Path] = {}
    if not directory.is_dir():
        return found
    for path in sorted(directory.iterdir()):
        m = pattern.match(path.name)
        if not m or not _present(path) or path.stat().st_size == 0:
            continue  # an empty faulthandler file: that rank was never signalled
        # py-spy JSON wins over the faulthandler text fallback when both exist
        if int(m.group(1)) not in found or path.suffix == ".json":
            found[int(m.group(1))] = path
    return found


def _load_stacks(run_dir: Path) -> dict[int, RankDump]:
    """py-spy JSON or faulthandler text, parsed as triage parses them; a file that holds no
    readable stack still counts (an empty dump: "an unreadable stack")."""
    stacks: dict[int, RankDump] = {}
    for rank, path in _load_rank_files(run_dir / "stacks", _STACK_FILE).items():
        text = path.read_text(errors="replace")
        if not text.strip():
            continue  # the faulthandler file every rank opens at start, never written
        dumps = parse_dump_text(text, str(path))
        stacks[rank] = dumps[0] if dumps else RankDump(None, None, None, [], str(path))
    return stacks


def _load_logs(run_dir: Path) -> dict[int, str]:
    logs = {}
    for path in sorted(run_dir.glob("rank*.log")):
        m = _RANK_FILE.match(path.name)
        if m and _present(path):
            logs[int(m.group(1))] = path.read_text(errors="replace")
    return logs


def _object(path: Path) -> dict[str, Any]:
    data = _read_json(path)
    if not isinstance(data, dict):
        kind = type(data).__name__
        raise RunDirError(f"{path} is damaged: it holds a JSON {kind}, not an object")
    return data


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
    return _object(path) if obj else _read_json(path)


def load_run(run_dir: Path | str) -> RunData:
    """Read a run directory; RunDirError names what is missing when nothing usable is there.

    Optional files (launcher.json, outputs, stacks) may be absent in older or partial runs."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise RunDirError(f"run directory {run_dir} does not exist")
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir} is not a directory")
    missing: list[str] = []
    manifest = _optional(run_dir, "manifest.json", missing, obj=True) or {}
    frames, bad = _load_frames(run_dir)
    logs = _load_logs(run_dir)
    if not manifest and frames.empty and not logs:
        raise RunDirError(
            f"{run_dir} is not a run directory: missing manifest.json, rank*.jsonl and rank*.log"
        )
    if frames.empty:
        missing.append("rank*.jsonl")
    data = RunData(run_dir=run_dir, manifest=manifest, frames=frames, logs=logs, bad_lines=bad)
    data.launcher = _optional(run_dir, "launcher.json", missing, obj=True)
    data.outputs = _optional(run_dir, "outputs.json", missing)
    data.reference = _optional(run_dir, "reference.json", missing)
    rpath = run_dir / "requests.json"  # only the sglang engine's client writes it
    data.requests = _object(rpath) if _present(rpath) else None
    bpath = run_dir / "budget.json"  # only written when the step budget ran out
    data.budget = _object(bpath) if _present(bpath) else None
    vpath = run_dir / "verdict.json"
    try:  # a damaged verdict is the report's to name (or to ignore, with --reclassify)
        data.verdict = _object(vpath) if _present(vpath) else None
    except RunDirError as exc:
        data.verdict_error = str(exc).removeprefix(f"{vpath} is ").removeprefix("damaged: ")
    data.stacks = _load_stacks(run_dir)
    data.missing = missing
    if manifest.get("engine") == "sglang":  # the facts its log adds, read here, not by the runner
        data.launcher = with_logged_crashes(data.launcher, logs, _text(run_dir / ev.SERVER_LOG))
    return data


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""  # no server log: nothing in it to read
