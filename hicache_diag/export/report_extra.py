"""REPORT.md's sections a maintainer asks for beyond the mechanism: whether production reaches
the state (apart from the code fact), what the run's evidence named, every committed run of
the same mechanism quoted from its verdict.json, the upstream status, and the non-fix the test
rejects."""

from __future__ import annotations

import json
from pathlib import Path

from hicache_diag.export.case import Case
from hicache_diag.export.evidence_tags import run_tags
from hicache_diag.export.recipes import Recipe


def _verdict_line(run: Path) -> str | None:
    try:
        v = json.loads((run / "verdict.json").read_text())
        m = json.loads((run / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    fd = v.get("first_divergence") or {}
    where = (
        f"first divergence at step {fd.get('step')} in `{fd.get('field')}` "
        f"{json.dumps(fd.get('values'))}"
        if fd
        else "no divergence located"
    )
    faults = ", ".join(m.get("faults") or []) or "none"
    version = (m.get("sglang") or {}).get("version", "?")
    secs = v.get("duration_s")
    took = f", {secs:.0f} s" if isinstance(secs, (int, float)) else ""
    return (
        f"| `{run.name}` | {version} | {faults} | {v.get('outcome')}, form "
        f"{v.get('form') or '-'} (exit {v.get('exit_code')}) | {where}{took} |"
    )


def runs_of(recipe: Recipe, case: Case) -> list[str]:
    """The committed runs beside this one whose evidence names the same mechanism."""
    if not recipe.evidence:
        return []
    rows = []
    for run in sorted(p for p in case.run_dir.parent.iterdir() if p.is_dir()):
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
