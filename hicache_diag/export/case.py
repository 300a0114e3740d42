"""What a run directory says about the failure an export is about: the release, the failing
rank and where it stopped, the launch and the workload, and the evidence lines worth quoting."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hicache_diag import evidence as ev
from hicache_diag.diagnosis.load import RunData, load_run
from hicache_diag.errors import RunDirError
from hicache_diag.evidence import files
from hicache_diag.evidence.verdict import Outcome, Verdict

_SITE = re.compile(r'File "[^"]*?/((?:sglang|torch)/[^"]*)')
_WHERE = re.compile(r"^(?P<fn>[\w.<>]+) \((?P<file>[\w.]+):(?P<line>\d+)\)$")


@dataclass(slots=True)
class Case:
    run_dir: Path
    version: str
    python: str | None
    server_argv: list[str]
    workload: dict[str, Any]
    faults: list[str]
    form: str | None
    signature: str | None
    failed_rank: int
    failed_pp: int
    function: str | None
    file: str | None
    line: int | None
    duration_s: float | None
    evidence: list[str] = field(default_factory=list)
    traceback: list[str] = field(default_factory=list)  # the failing rank's, SGLang frames only
    last_rows: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    model_config: dict[str, Any] | None = None
    numbers: dict[str, int] = field(default_factory=dict)  # values the test template takes
    # first_divergence/rank{r}.json, where SGLang's consensus checker fired (else empty)
    blocks: dict[int, ev.DivergenceBlock] = field(default_factory=dict)
    cache_class: str | None = None  # the tree cache the ranks ran (None: the run does not say)

    @property
    def storage(self) -> bool:
        """The run had an L3 storage backend."""
        return "--hicache-storage-backend" in self.server_argv


_FRAME = re.compile(r'^\s*File "[^"]*?(?P<file>[\w.]+)", line (?P<line>\d+), in (?P<fn>[\w.<>]+)')


def _raising_frame(traceback: list[str]) -> re.Match[str] | None:
    """The last `File ..., line N, in fn` of a traceback: where the error was raised."""
    frames = [m for m in map(_FRAME.match, traceback) if m]
    return frames[-1] if frames else None


def _traceback(log: str, signature: str | None) -> list[str]:
    """The failing rank's `Scheduler hit an exception` traceback, without frames of the tool's
    plugin (they are not SGLang's code, and a maintainer reads them first)."""
    lines = log.splitlines()
    start = next(
        (i for i, ln in enumerate(lines) if "Traceback (most recent call last)" in ln), None
    )
    if start is None:
        return []
    out, skip = [lines[start].split("] ", 1)[-1]], False
    for ln in lines[start + 1 :]:
        if ln.startswith("  File "):
            skip = "hicache_diag" in ln
            if not skip:  # from the package on: the install prefix is this machine's
                out.append(_SITE.sub(r'File "\1', ln))
            continue
        if ln.startswith("    "):
            if not skip:
                out.append(ln)
            continue
        out.append(ln)
        break
    return [ln for ln in out if not set(ln.strip()) <= {"^", "~"}]


def _numbers(data: RunData, failed_rank: int) -> dict[str, int]:
    """The write the failing rank could not back up (tokens) and PP0's host room before it."""
    frames = data.frames
    out: dict[str, int] = {}
    if frames.empty:
        return out
    leader = frames[frames["rank"] == 0]
    if "write_backs" in leader and "host_free" in leader:
        wrote = leader[leader["write_backs"].fillna(0) > 0]
        if not wrote.empty:
            first = wrote.iloc[0]
            out["kv_tokens"] = int(first["write_backs"])
            out["leader_host_free"] = int(first["host_free"]) + int(first["write_backs"])
    return out


def _model_config(manifest: ev.Manifest) -> dict[str, Any] | None:
    """The model's config as the run recorded it, else as its directory still holds it."""
    recorded = manifest.config.get("model_config")
    if recorded:
        return recorded
    model = (manifest.config.get("spec", {}) or {}).get("model")  # the sglang engine's options
    if not model:
        return None
    try:  # what the manifest names, read as input: a regular file, bounded
        config = files.read_json(Path(str(model)) / "config.json")
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


# SGLang's start-up line naming the tree cache class (0.5.18-0.5.23), else the radix file a
# traceback ran through.
_TREE_LINE = re.compile(r"Tree cache initialized: .*?\bimpl=(\w+)")
_TREE_FILES = {"hiradix_cache.py": "HiRadixCache", "unified_radix_cache.py": "UnifiedRadixCache"}


def cache_class(logs: dict[int, str], traceback: list[str]) -> str | None:
    """The tree cache class the run's ranks ran, from their logs; None when they do not say."""
    for log in logs.values():
        if m := _TREE_LINE.search(log):
            return m.group(1)
    files = [m["file"] for m in map(_FRAME.match, traceback) if m]
    return next((_TREE_FILES[f] for f in reversed(files) if f in _TREE_FILES), None)


def _exportable(run_dir: Path, data) -> Verdict:
    """The run's verdict, when export has a branch to test: a run of a release (its manifest
    names one) whose failing rank crashed, hung or parted from the others."""
    if not data.manifest.sglang:
        raise RunDirError(
            f"{run_dir}: a run of the {data.manifest.engine or 'builtin'} engine, which names "
            "no SGLang release; export writes tests for a release's own code (run with "
            "--engine sglang)"
        )
    patch = (data.manifest.sglang.get("patch") or {}).get("file")
    if patch:
        raise RunDirError(
            f"{run_dir}: a run of sglang {data.manifest.sglang.get('version')} with --patch "
            f"{patch}: its code is not the release's, so no file:line of the release describes "
            "it; export a run of the release as it is"
        )
    verdict = data.verdict
    if verdict is None:
        raise RunDirError(
            f"{run_dir}: no verdict.json (the run never finished); rerun it or "
            "`hicache-diag report --reclassify` it first"
        )
    # "diverged": the stages parted without stopping (the 0.5.19 waiting timeout)
    outcomes = (Outcome.CRASH, Outcome.HANG, Outcome.DIVERGED)
    if verdict.outcome not in outcomes or verdict.failed_rank is None:
        raise RunDirError(
            f"{run_dir}: outcome {verdict.outcome.value!r}, not a crash, hang or divergence of "
            "one rank: export writes a test for the branch a failing rank took"
        )
    return verdict


def load_case(run_dir: Path) -> Case:
    data = load_run(run_dir)
    manifest = data.manifest
    verdict = _exportable(run_dir, data)
    rank = int(verdict.failed_rank)
    entry = next((r for r in verdict.ranks if r.rank == rank), None)
    traceback = _traceback(data.logs.get(rank, ""), verdict.signature)
    # `where` names the rank's Python frame; when it names a native one instead (a py-spy dump
    # of the dying process during SGLang's SIGQUIT teardown), the traceback's raising frame.
    m = _WHERE.match((entry.where if entry else None) or "")
    if m is None or not m["file"].endswith(".py"):
        m = _raising_frame(traceback) or m
    sglang = manifest.sglang or {}  # the release, as the sglang engine wrote it
    argv = list(sglang.get("argv") or [])
    return Case(
        run_dir=run_dir,
        version=str(sglang.get("version") or "unknown"),
        python=sglang.get("python"),
        server_argv=argv,
        workload=dict(manifest.config.get("workload", {}) or {}),
        faults=list(manifest.faults or []),
        form=verdict.form.value if verdict.form else None,
        signature=verdict.signature,
        failed_rank=rank,
        failed_pp=int(entry.pp if entry else 0),
        function=m["fn"] if m else None,
        file=m["file"] if m else None,
        line=int(m["line"]) if m else None,
        duration_s=verdict.duration_s,
        evidence=[str(e) for e in verdict.evidence],
        traceback=traceback,
        last_rows={r: data.rank_frames(r).tail(3).to_dict("records") for r in data.ranks},
        model_config=_model_config(manifest),
        numbers=_numbers(data, rank),
        blocks=_blocks(run_dir),
        cache_class=cache_class(data.logs, traceback),
    )


def _blocks(run_dir: Path) -> dict[int, ev.DivergenceBlock]:
    try:
        return ev.read_blocks(run_dir)
    except ValueError as exc:
        raise RunDirError(f"first-divergence block unreadable: {exc}") from exc
