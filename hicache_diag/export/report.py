"""The export's REPORT.md: the invariant broken, the mechanism with file:line in the run's
release, evidence excerpts from the run directory, related upstream threads, the release range."""

from __future__ import annotations

import json
from pathlib import Path

from hicache_diag.export import report_extra
from hicache_diag.export.case import Case
from hicache_diag.export.divergence_block import block_section
from hicache_diag.export.evidence_tags import run_tags
from hicache_diag.export.recipes import Recipe
from hicache_diag.export.source_lines import locate, present
from hicache_diag.export.trees import install_command

_ROW_KEYS = (
    "step",
    "host_free",
    "write_backs",
    "load_backs",
    "sync_received",
    "queues",
    "faults_fired",
    "error",
)


def _row(row: dict) -> str:
    keep = {}
    for k in _ROW_KEYS:
        v = row.get(k)
        if v is None or (isinstance(v, float) and v != v):
            continue
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if k == "queues" and isinstance(v, dict):
            v = {q: n for q, n in v.items() if q.startswith("ack_")}
        keep[k] = v
    return json.dumps(keep, default=str)


def _model(case: Case) -> str:
    cfg = case.model_config
    if not cfg:
        return "the model directory of the run (its config.json was not readable at export)"
    keys = (
        "architectures",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "vocab_size",
    )
    shape = ", ".join(f"{k}={cfg[k]}" for k in keys if k in cfg)
    return (
        f"a tiny random-weight Llama ({shape}); `model_config.json` here is its config. "
        "Any Llama-architecture model whose vocabulary covers the request ids serves the "
        "same sequence; outputs do not matter, the cache's bookkeeping does"
    )


def mechanism_lines(recipe: Recipe, package: Path | None, version: str) -> list[str]:
    out = []
    for i, step in enumerate(recipe.steps, 1):
        found = locate(package, step) if package is not None else None
        name, where = step.function, f"sglang/{step.file} (not found in this release)"
        if found:
            name, where = found[0], f"sglang/{step.file}:{found[1]}"
        out.append(f"{i}. `{step.cls}.{name}` ({where}): {step.says}.")
    if package is None:
        out.append(
            f"\n(No copy of SGLang {version}'s source was found at export time, so the "
            "lines are not given; the traceback below has the crash line. To have them: "
            f"`{install_command(version)}`, then export again.)"
        )
    return out


def range_lines(recipe: Recipe, trees: dict[str, Path]) -> list[str]:
    if not trees:
        return [
            "No other release's source was at hand at export time "
            "(set HICACHE_DIAG_SGLANG_RELEASES or HICACHE_DIAG_SGLANG_VENVS)."
        ]
    out = [
        "Every step of the mechanism above, looked up in each release's source (the same "
        "code shape, not a run of each release):",
        "",
        "| release | mechanism present |",
        "|---|---|",
    ]
    has = {v: present(p, recipe.steps) for v, p in trees.items()}
    out += [f"| {v} | {'yes' if ok else 'no'} |" for v, ok in has.items()]
    yes = [v for v, ok in has.items() if ok]
    if yes:
        out += ["", f"Present in {yes[0]} .. {yes[-1]} of the releases checked."]
    return out


def render(
    case: Case,
    recipe: Recipe,
    package: Path | None,
    trees: dict[str, Path],
    files: dict[str, str],
    patches: frozenset[str] = frozenset(),
) -> str:
    lines = _run_lines(case, recipe)
    lines += ["", f"## Mechanism (SGLang {case.version})", ""]
    lines += mechanism_lines(recipe, package, case.version)
    lines += _evidence_lines(case)
    lines += block_section(case.blocks, sorted(case.last_rows))
    lines += _reproduce_lines(case, recipe, files)
    lines += report_extra.sections(case, recipe, patches)
    lines += ["", "## Related upstream threads", "", "| thread | state | what |", "|---|---|---|"]
    lines += [f"| [{r.ref}]({r.url}) | {r.state} | {r.why} |" for r in recipe.related]
    lines += ["", "## Release range", ""] + range_lines(recipe, trees) + [""]
    return "\n".join(lines)


def _run_lines(case: Case, recipe: Recipe) -> list[str]:
    """The title, the invariant broken and the run: where it failed, its flags, its trigger."""
    argv = case.server_argv
    flags = argv[argv.index("--model-path") :] if "--model-path" in argv else argv
    lines = [
        f"# {recipe.title} (SGLang {case.version})",
        "",
        f"Exported by hicache-diag from run `{case.run_dir.name}`. Nothing here imports "
        "hicache-diag: the test runs with plain pytest against the installed SGLang.",
        "",
        "## Invariant broken",
        "",
        recipe.invariant,
        "",
        "## The run",
        "",
        f"- {f'form {case.form}' if case.form else 'diverged'}: PP{case.failed_pp} "
        f"(rank {case.failed_rank})"
        + (f" in `{case.function}` ({case.file}:{case.line})" if case.function else "")
        + f": `{case.signature}`"
        + (f", {case.duration_s:.0f} s into the run" if case.duration_s else ""),
        "- server flags: `" + " ".join(flags) + "`",
    ]
    if case.faults and recipe.evidence:
        lines.append(f"- trigger: injected ({', '.join(case.faults)}); see Reachable in production")
    elif case.faults:
        lines.append(
            f"- trigger: injected ({', '.join(case.faults)}). The injection made one rank's "
            "backup fail; the exported test reaches the same branch through SGLang's own "
            "shortage path instead (host pool short, `evict_host` frees nothing), so it "
            "shows the missing invariant, not a claim that this trigger occurs naturally."
        )
    else:
        lines.append("- trigger: none injected (SGLang's own code on this workload)")
    return lines


def _evidence_lines(case: Case) -> list[str]:
    """The verdict's evidence, the failed rank's traceback, each rank's last recorded steps."""
    lines = ["", "## Evidence (excerpts from the run directory)", "", "Verdict:", ""]
    lines += [f"- {e}" for e in case.evidence]
    if case.traceback:
        lines += [
            "",
            f"PP{case.failed_pp}'s traceback (SGLang frames only; the tool's "
            "recorder frames left out):",
            "",
            "```",
        ]
        lines += case.traceback + ["```"]
    lines += ["", "Last recorded steps per rank (`rank<r>.jsonl`):", "", "```"]
    for rank, rows in case.last_rows.items():
        lines += [f"rank {rank}: {_row(r)}" for r in rows]
    return lines + ["```"]


def _error(case: Case, recipe: Recipe) -> str:
    """The exception the exported test fails with, as SGLang or the test raises it."""
    if recipe.error_for is None:
        return recipe.error
    tags = run_tags(case.run_dir)
    values: dict[str, object] = {}
    for name in recipe.evidence:
        values.update(tags[name].values if name in tags else {})
    return recipe.error_for(values)


def _reproduce_lines(case: Case, recipe: Recipe, files: dict[str, str]) -> list[str]:
    lines = [
        "",
        "## Reproduce",
        "",
        f"- unit test: `python -m pytest -q {files['test']}`; on an affected release it "
        f"fails with `{_error(case, recipe)}`, and it skips where the code path is gone.",
        f"- end to end: `MODEL=<dir> PYTHON=<python with SGLang {case.version}> "
        f"./{files['launch']}` (add `GPU=1` on a GPU host). Requests: "
        f"`{files['requests']}` ({case.workload.get('requests', '?')} requests, sent "
        "in waves of the PP size, as the run did). Model: " + _model(case) + ".",
    ]
    if case.faults:
        lines.append(
            "- the launch script replays the workload only: without the injected "
            "trigger it is not expected to crash."
        )
    return lines
