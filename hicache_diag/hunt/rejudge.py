"""A saved hunt brought up to date with the tool's own judgment: each trigger's first failing
run classified afresh (classify_run, the one classify path), its first divergence compared
with the one hunt.json recorded when the hunt ran. Data only: cli/report.py shows and saves."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hicache_diag.errors import RunDirError
from hicache_diag.evidence.files import read_json
from hicache_diag.evidence.output_paths import is_run_dir
from hicache_diag.hunt.model import HuntReport, TriggerResult

HUNT_JSON = "hunt.json"
TABLE_TXT = "table.txt"  # the table as printed, kept beside hunt.json (samples/hunt/)


def is_hunt_dir(path: Path) -> bool:
    return (path / HUNT_JSON).is_file() and not is_run_dir(path)


@dataclass(frozen=True, slots=True)
class Rejudged:
    """One trigger's first failing run, judged again. `run`: where it was found (None: not
    here, and the recorded entry is kept); `after`: the fresh first divergence; `error`: why
    the run could not be classified (the recorded entry is kept)."""

    trigger: str
    recorded_run: str
    run: Path | None
    before: dict[str, Any] | None
    after: dict[str, Any] | None = None
    outcome: str | None = None  # the fresh verdict's (a failure, unless the classifier changed)
    error: str | None = None

    @property
    def judged(self) -> bool:
        return self.run is not None and self.error is None

    @property
    def changed(self) -> bool:
        return self.judged and self.after != self.before


@dataclass(slots=True)
class HuntRejudge:
    hunt_dir: Path
    raw: dict[str, Any]  # hunt.json as read: saving rewrites only its first divergences
    report: HuntReport  # the recorded report with each judged run's first divergence
    runs: list[Rejudged]

    @property
    def changed(self) -> list[Rejudged]:
        return [r for r in self.runs if r.changed]

    def hunt_json(self) -> str:
        """hunt.json with each changed trigger's `first_divergence` (and `via`, derived from
        it) replaced; every other key as it was, formatted as `save_report` writes it."""
        fresh = {r.name: r for r in self.report.results}
        changed = {r.trigger for r in self.changed}
        raw = copy.deepcopy(self.raw)
        for entry in raw["results"]:
            if entry["trigger"] in changed:
                entry["first_divergence"] = fresh[entry["trigger"]].first_divergence
                if "via" in entry:
                    entry["via"] = fresh[entry["trigger"]].via
        return json.dumps(raw, indent=2, sort_keys=True) + "\n"


def load_hunt(hunt_dir: Path) -> tuple[dict[str, Any], HuntReport]:
    """hunt.json, read and checked (RunDirError: damaged, one line)."""
    path = hunt_dir / HUNT_JSON
    try:
        raw = read_json(path)  # bounded: a regular file, its size and nesting (evidence/files)
        return raw, HuntReport.from_json(raw)
    except (OSError, UnicodeDecodeError) as exc:
        raise RunDirError(f"{path} cannot be read: {exc}") from None
    except (ValueError, TypeError, KeyError, IndexError) as exc:
        raise RunDirError(f"{path} is damaged: {exc}") from None


def locate_run(recorded: str, trigger: str, hunt_dir: Path) -> Path | None:
    """The recorded run dir on this machine: as written (absolute, or relative to where the
    command runs); a relative one also against the hunt dir and each folder above it (a
    committed sample records it relative to the repo); an absolute one that is gone under
    the hunt dir by its `<trigger>/...` tail (the layout run.py writes), for a moved hunt."""
    path = Path(recorded)
    tries = [path]
    base = hunt_dir.resolve()
    if not path.is_absolute():
        tries += [folder / path for folder in (base, *base.parents)]
    elif trigger in path.parts:
        at = len(path.parts) - 1 - path.parts[::-1].index(trigger)
        tries.append(base.joinpath(*path.parts[at:]))
    return next((p for p in tries if is_run_dir(p)), None)


def _judge(result: TriggerResult, hunt_dir: Path) -> Rejudged:
    from hicache_diag.diagnosis.classify import classify_run
    from hicache_diag.engines.registry import tie_tolerance
    from hicache_diag.hunt.run import first_divergence_of

    recorded = str(result.first_failure)
    run = locate_run(recorded, result.name, hunt_dir)
    judged = Rejudged(result.name, recorded, run, result.first_divergence)
    if run is None:
        return judged
    try:
        verdict = classify_run(run, tie_tolerance)
    except (RunDirError, OSError, ValueError) as exc:
        return replace(judged, error=str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    return replace(judged, after=first_divergence_of(verdict), outcome=verdict.outcome.value)


def rejudge_hunt(hunt_dir: Path) -> HuntRejudge:
    """Every trigger with a first failing run, judged again; the others as recorded."""
    raw, report = load_hunt(hunt_dir)  # `raw` stays as read; `report` is updated below
    runs = [_judge(r, hunt_dir) for r in report.results if r.first_failure]
    by_name = {r.trigger: r for r in runs}
    report.results = [
        replace(r, first_divergence=by_name[r.name].after)
        if r.name in by_name and by_name[r.name].judged
        else r
        for r in report.results
    ]
    return HuntRejudge(hunt_dir, raw, report, runs)
