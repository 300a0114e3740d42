"""REPORT.md's sections a maintainer asks for beyond the mechanism: whether production reaches
the state (apart from the code fact), what the run's evidence named, every committed run of
the same mechanism quoted from its verdict.json, the upstream status, and the non-fix the test
rejects."""

from __future__ import annotations

import json
from pathlib import Path

from hicache_diag.evidence import files
from hicache_diag.export.case import Case
from hicache_diag.export.evidence_tags import run_tags
from hicache_diag.export.recipes import Recipe

# At most this many runs are quoted beside the exported one (a hunt has one per trigger).
MAX_RUNS_QUOTED = 32


def _verdict_line(run: Path) -> str | None:
    try:  # read as input: regular files, bounded (a FIFO or a damaged file is skipped)
        v = files.read_json(run / "verdict.json")
        m = files.read_json(run / "manifest.json")
    except (OSError, ValueError):
        return None
    if not isinstance(v, dict) or not isinstance(m, dict):
        return None
    fd = v.get("first_divergence") if isinstance(v.get("first_divergence"), dict) else {}
    where = (
        f"first divergence at step {fd.get('step')} in `{fd.get('field')}` "
        f"{json.dumps(fd.get('values'))}"
        if fd
        else "no divergence located"
    )
    faults = m.get("faults") if isinstance(m.get("faults"), list) else []
    sglang = m.get("sglang") if isinstance(m.get("sglang"), dict) else {}
    secs = v.get("duration_s")
    took = f", {secs:.0f} s" if isinstance(secs, (int, float)) else ""
    return (
        f"| `{run.name}` | {sglang.get('version', '?')} | {', '.join(map(str, faults)) or 'none'}"
        f" | {v.get('outcome')}, form {v.get('form') or '-'} (exit {v.get('exit_code')}) | "
        f"{where}{took} |"
    )


def hunt_runs(run_dir: Path) -> list[Path]:
    """The runs a hunt recorded beside this one: its hunt.json (two levels up: HUNT/runs/RUN)
    names each trigger's first failing run. Export reads only the run it was given and what
    that record names, never every folder beside it (a FIFO there, 300 siblings)."""
    hunt_json = run_dir.resolve().parent.parent / "hunt.json"
    try:
        hunt = files.read_json(hunt_json)
    except (OSError, ValueError):
        return []
    results = hunt.get("results") if isinstance(hunt, dict) else None
    named = {
        Path(str(e["first_failure"])).name
        for e in (results if isinstance(results, list) else [])
        if isinstance(e, dict) and e.get("first_failure")
    }
    runs = [run_dir.resolve().parent / name for name in sorted(named)]
    return [r for r in runs if r.is_dir()][:MAX_RUNS_QUOTED]


def runs_of(recipe: Recipe, case: Case) -> list[str]:
    """The hunt's runs beside this one whose evidence names the same mechanism."""
    if not recipe.evidence:
        return []
    rows = []
    for run in hunt_runs(case.run_dir):
        if set(recipe.evidence) & set(run_tags(run)) and (line := _verdict_line(run)):
            rows.append(line)
    if not rows:
        return []
    return [
        "",
        "## Committed runs of this mechanism",
        "",
        f"Every run directory beside `{case.run_dir.name}` whose evidence names "
        f"{'/'.join(recipe.evidence)}, quoted from its `verdict.json`:",
        "",
        "| run | release | faults | verdict | divergence |",
        "|---|---|---|---|---|",
        *rows,
    ]


def sections(case: Case, recipe: Recipe, patches: frozenset[str] = frozenset()) -> list[str]:
    """`patches`: the hand-made `nonfix.patch` / `fix.patch` beside the export (written by hand
    into the committed exports, never by export): a section describes only a patch that is
    there."""
    from hicache_diag.export.launch import scripted

    out: list[str] = []
    if scripted(case):
        out.append(
            f"- the run's workload ({case.workload.get('workload')}) was a script of "
            "session / flush calls (`script.json`, as the run sent it); `requests.json` "
            "is empty and `launch.sh` only starts the server with the run's flags: the "
            "unit test is the repro."
        )
    tags = run_tags(case.run_dir)
    named = [tags[n].says for n in recipe.evidence if n in tags]
    if named:
        out += ["", "## What the run's evidence named", "", *[f"- {s}" for s in named]]
    if recipe.reachable:
        out += ["", "## Reachable in production", "", recipe.reachable]
    out += runs_of(recipe, case)
    if recipe.upstream:
        out += ["", "## Upstream status", "", recipe.upstream]
    if recipe.nonfix and "nonfix.patch" in patches:
        out += [
            "",
            "## A fix, told from a non-fix",
            "",
            "The test asserts the state that must agree across the simulated ranks, not "
            "only that nothing raised.",
            "",
            recipe.nonfix,
        ]
    if recipe.fix and "fix.patch" in patches:
        out += ["", "## A candidate fix (`fix.patch`)", "", recipe.fix]
    return out
