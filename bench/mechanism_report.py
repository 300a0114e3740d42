"""One REPORT.md per open 0.5.23 mechanism, written as the comment a maintainer would want on its
upstream thread, from committed evidence only: nothing in it is typed from memory.

    python bench/mechanism_report.py session-reap flush-deadline write-through

Reads, for each mechanism (`MECHANISMS` below: its exports, bisects and threads):
- the export recipe (hicache_diag/export: title, invariant, steps, fix and non-fix texts) and
  the mechanism's file:line in this interpreter's SGLang 0.5.23 (read with `ast`);
- `samples/exports/release-range.json` (bench/export_release_range.py): the export's test run
  with plain pytest in every release installed, and the code-shape check per release;
- `samples/exports/patch-check-0.5.23.json` (bench/export_patch_check.py): the test on the
  release, under `nonfix.patch` and under `fix.patch`;
- `samples/bisect/<dir>/` (bisect `--switch patch=none,FILE` on the real engine, warm) and its
  `trials.json` (bench/bisect_patch_summary.py), and `samples/bisect/sglang-0.5.23-fix-cost/`
  (the default workload's cache hit counts per rank, with and without each fix);
- the fix.patch itself.
Writes `samples/reports/<mechanism>/REPORT.md`. Missing evidence is said as missing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hicache_diag.export.recipes import RECIPES  # noqa: E402
from hicache_diag.export.report import mechanism_lines  # noqa: E402

EXPORTS = ROOT / "samples" / "exports"
BISECTS = ROOT / "samples" / "bisect"
COST = BISECTS / "sglang-0.5.23-fix-cost"
_PULL = "https://github.com/sgl-project/sglang/pull/"


class Mechanism(NamedTuple):  # no dataclass: the bench tests load this file without a module entry
    name: str
    recipe: str
    exports: tuple[str, ...]  # samples/exports/<finding>, the first one's fix.patch is the fix
    bisects: tuple[tuple[str, str], ...]  # (samples/bisect dir, what its trigger is)
    to: str  # the upstream thread this comment is for
    opening: str  # one paragraph: what a maintainer sees first
    extra_threads: tuple[tuple[str, str, str], ...] = ()  # (ref, state, why)
    # What the end-to-end runs' own logs show, beyond the table (each names its run dir).
    seen: tuple[str, ...] = ()


MECHANISMS = {
    "session-reap": Mechanism(
        "session-reap",
        "session-reap-per-rank-tick",
        ("session-reap",),
        (
            (
                "sglang-0.5.23-session-reap-fix",
                "natural: the hunt's `session-close` workload (three streaming sessions, each "
                "closed while its turn decodes), no fault",
            ),
        ),
        "#40250 (its part (b)), as a comment",
        "Under PP the reap tick is per rank too, not only across the TP group: with PP2 and "
        "three streaming sessions closed mid-decode, the stages released a session at "
        "different scheduler iterations in most runs and then admitted different batches. "
        "Below: a unit test that drives `Scheduler.ingest_requests` on two real gloo ranks "
        "with only the clock differing, a candidate fix in the shape #37143 used for the "
        "waiting timeout (PP0 decides, the decision rides the request broadcast and PP relay), "
        "and the fix checked end to end on the real server.",
        seen=(
            "Every unpatched failure's first divergence is attributed to the reap tick "
            "(`session-clock`: one rank closed the session, the other not yet); in "
            "`runs/unpatched-trial0-seed0/` PP1's tick released `c000` at step 356 and PP0's a "
            "tick later, then PP1 raised `shape '[96, -1, 16]' is invalid for input of size 64`.",
            "With the fix, `runs/fix-trial1-seed1/`'s server log has `Deferred close ready for "
            "session c00N, releasing.` on PP0 and PP1 in the same second for each session, and "
            "the outputs equal the `transformers` reference.",
        ),
    ),
    "flush-deadline": Mechanism(
        "flush-deadline",
        "flush-deadline-per-rank-clock",
        ("flush-deadline",),
        (
            (
                "sglang-0.5.23-flush-deadline-fix",
                "fault: the hunt's `flush-deadline` trigger with `flush-clock:rank=1,"
                "offset-ms=3000` (PP1 stamps its deadline 3 s later: a stage that received the "
                "request a relay later, or was stalled when it arrived); the natural variant "
                "(no fault) diverged in 0 of 9 hunt trials on 0.5.18 and 0.5.23",
            ),
        ),
        "a new issue, referring to #21413 (which added the deferred flush) and #27446",
        "`/flush_cache?timeout=T` under PP can flush one stage and not the other: each rank "
        "stamps and tests the deadline on its own clock (`SchedulerFlushWrapper`), so near the "
        "deadline one stage gives up while its peer, idle an iteration later, resets its whole "
        "tree and pools. The stages then hold different trees and split the next batch "
        "differently. Below: a unit test driving the flush wrapper through "
        "`Scheduler.ingest_requests` on two real gloo ranks with only the clock differing, a "
        "candidate fix (PP0 reads the deadline, its decision rides the request relay), and the "
        "fix checked end to end on the real server.",
        (
            (
                "#27446",
                "merged",
                "PP `is_fully_idle` missed in-flight microbatches (a flush under PP reset a "
                "tree other stages still used): the same family, the idle check, not the clock",
            ),
        ),
        seen=(
            "Unpatched, `runs/unpatched-trial0-seed0/`: PP0 logs `Deferred flush_cache timed "
            "out while waiting for idle state.` at 10:46:17 and PP1 `Cache flushed "
            "successfully!` at 10:46:19; PP1 reset its tree alone (`host_free` PP0 364 / PP1 "
            "516 at step 1294) and the next shared-prefix request split differently (PP1: "
            "`shape '[80, -1, 16]' is invalid for input of size 1024`). All ten failures name "
            "the deferred flush as the source.",
            "With the fix, `runs/fix-trial0-seed0/` has every flush outcome on PP0 and PP1 in "
            "the same second (both flushed, then both timed out for each later round), and "
            "the outputs equal the reference.",
        ),
    ),
    "write-through": Mechanism(
        "write-through",
        "urc-write-through-per-rank",
        ("write-through-form-a", "write-through-form-b", "write-through-form-c-tp"),
        (
            (
                "sglang-0.5.23-write-through-fix",
                "fault: `host-shortage:rank=0,leave=0` (PP0's host pool held by a side pool; "
                "the hunt's host-pool trigger on the leader), `--max-total-tokens 256`, PP2; "
                "the natural small-pool variant diverged in 0 of 9 hunt trials",
            ),
            (
                "sglang-0.5.23-write-through-form-c-tp",
                "fault: `host-shortage:rank=1,leave=0` on TP2 (PP1), page size 1, "
                "`--max-total-tokens 256`: the committed form C-TP run's trigger",
            ),
        ),
        "#31425 (and #28429, which states the root cause), as a comment",
        "`UnifiedRadixCache` (0.5.23) has the mechanism #28429 describes and #31425 addresses "
        "for `HiRadixCache`: `_execute_kv_backup` decides a write-through backup on each rank's "
        "own host room, while only the number of acks drained is agreed afterwards. One rank "
        "short of host memory leaves the ranks apart three ways, one per topology: PP1 short "
        "pops an ack it never had (`IndexError: pop from empty list`, form B), PP0 short relays "
        "0 acks so PP1's locks stay and the stages admit different batches (a reshape error on "
        "PP1, form A), a TP rank short makes the MIN 0 and the other TP rank's lock stays (a "
        "hang, form C). Below: one unit test per form on two real gloo ranks with a real "
        "`UnifiedRadixCache`, and a candidate fix: the host room becomes a per-round quantity, "
        "agreed in the ready-count reduce every rank already runs at the same point of each "
        "round (PP0's attention-group MIN, relayed down the pipeline), and each backup that "
        "round spends from it, with no collective at decision time. It passes the unit tests "
        "of forms A and C-TP and ends form A on the real PP2 server; a first candidate that "
        "relayed the room at each decision deadlocked the pipeline (history below).",
        seen=(
            "Unpatched, `runs/unpatched2-trial1-seed1/`: PP0's host pool held, PP1 backs up "
            "132 tokens PP0 skips and raises `shape '[60, -1, 16]' is invalid for input of "
            "size 8000` (form A); every unpatched trial crashed in form A.",
            "With the per-round room, `runs/fix2-trial0-seed0/`: both stages skip the same "
            "backups (`write_backs` 0 on each, the same evictions and prefix hits) and the "
            "outputs equal the reference.",
        ),
    ),
}


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _recipe(name: str):
    return next(r for r in RECIPES if r.name == name)


def _package_0523() -> Path | None:
    import importlib.metadata as md
    import importlib.util

    spec = importlib.util.find_spec("sglang")
    if spec is None or md.version("sglang") != "0.5.23":
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _patch_body(path: Path) -> tuple[str, str]:
    text = path.read_text()
    head, sep, rest = text.partition("\n--- a/")
    return head.strip(), ("--- a/" + rest) if sep else ""


def _bisect_section(m: Mechanism) -> list[str]:
    out = ["## End to end on the real server (SGLang 0.5.23, PP2, CPU)", ""]
    for folder, trigger in m.bisects:
        root = BISECTS / folder
        table = _json(root / "table.json")
        if not table:
            out += [f"`samples/bisect/{folder}/`: not run yet.", ""]
            continue
        summary = summarize_committed(table)
        out += [f"Trigger: {trigger}. One command, warm servers (`samples/bisect/{folder}/`):", ""]
        out += ["```", _command(root), "```", ""]
        out += ["| patch | diverged / trials | 95% Wilson interval | upper bound | forms |"]
        out += ["|---|---|---|---|---|"]
        for c in summary:
            forms = ", ".join(f"{k} {n}" for k, n in sorted(c["forms"].items())) or "-"
            lo, hi = c["ci95"]
            out.append(
                f"| {c['patch']} | {c['failures']}/{c['trials']} | [{lo:.2f}, {hi:.2f}] | "
                f"{hi:.2f} | {forms} |"
            )
        out += ["", *[f"The tool's verdict: `{v}`." for v in table.get("verdict", [])], ""]
        if folder == m.bisects[0][0] and m.seen:
            out += [f"- {line} (`samples/bisect/{folder}/`)" for line in m.seen] + [""]
        readme = root / "README.md"
        if readme.is_file():
            host = [ln for ln in readme.read_text().splitlines() if ln.startswith("Host: ")]
            out += [host[0], ""] if host else []
    return out


def summarize_committed(table: dict) -> list[dict]:
    """Per cell of a committed table.json: patch, trials, failures, forms, Wilson interval."""
    cells = []
    for cell in table.get("cells", []):
        patch = cell["values"].get("patch", "none")
        cells.append(
            {
                "patch": "none (0.5.23 as released)" if patch == "none" else f"`{patch}`",
                "trials": cell["trials"],
                "failures": cell["failures"],
                "forms": cell.get("forms", {}),
                "ci95": cell["ci95"],
            }
        )
    return cells


def _command(root: Path) -> str:
    readme = root / "README.md"
    if not readme.is_file():
        return "(see the folder's table.json)"
    lines = readme.read_text().splitlines()
    start = next((i for i, ln in enumerate(lines) if "hicache-diag bisect" in ln), None)
    if start is None:
        return "(see the folder's README.md)"
    block = []
    for ln in lines[start:]:
        if not ln.strip():
            break
        block.append(ln.strip())
    return "\n    ".join(block)


def _cost_section(m: Mechanism) -> list[str]:
    out = ["## What the fix costs", ""]
    fix = f"samples/exports/{m.exports[0]}/fix.patch"
    if not (COST / "trials.json").is_file():
        return out + ["The default workload's hit counts were not measured yet.", ""]
    trials = json.loads((COST / "trials.json").read_text())
    sha = hashlib.sha256((ROOT / fix).read_bytes()).hexdigest()
    stale = [t for t in trials if t["patch"] == fix and t["patch_sha256"] != sha]
    if stale:  # measured with an earlier candidate: its rows would speak for another patch
        trials = [t for t in trials if t not in stale]
        out += [
            f"The default workload was measured with an earlier fix.patch (sha256 "
            f"{stale[0]['patch_sha256'][:12]}), not this one ({sha[:12]}): not shown.",
            "",
        ]
    by = {(t["patch"], t["trial"]): t for t in trials}
    seeds = sorted({t["trial"] for t in trials}, key=lambda n: int(n.split("seed")[-1]))
    out += [
        "The default workload (`hicache-diag run --engine sglang --pp 2`: 24 shared-prefix "
        "requests, seed per trial, the same seeds in each cell) on the release and under the "
        "fix, warm servers, one bisect over every fix (`samples/bisect/sglang-0.5.23-fix-cost/`"
        f"{'' if (COST / 'table.json').is_file() else ', interrupted: its README says where'}). "
        "Tokens served from the device tree (`prefix_hit`) and from host memory (`host_hit`), "
        "per rank, from each trial's verdict:",
        "",
        "| trial | 0.5.23 as released: rank 0, rank 1 | with fix.patch: rank 0, rank 1 |",
        "|---|---|---|",
    ]
    for seed in seeds:
        cells = []
        for patch in ("none", fix):
            t = by.get((patch, seed))
            if t is None:
                cells.append("not run")
            elif t["outcome"] != "ok":
                cells.append(f"{t['outcome']}{' ' + t['form'] if t['form'] else ''}")
            else:
                cells.append(
                    ", ".join(
                        f"{c.get('prefix_hit', 0)} / {c.get('host_hit', 0)}"
                        for _, c in sorted(t["cache"].items())
                    )
                )
        out.append(f"| {seed} | {cells[0]} | {cells[1]} |")
    out.append("")
    return out


def _span(versions: list[str]) -> str:
    if not versions:
        return "none"
    return versions[0] if len(versions) == 1 else f"{versions[0]}-{versions[-1]}"


def range_headline(m: Mechanism) -> str:
    """One line, read off release-range.json and the committed runs: where the test fails,
    where the code is, where a real run showed it."""
    data = _json(EXPORTS / "release-range.json")
    if not data:
        return "Affected releases: not computed (no samples/exports/release-range.json)."
    order = list(data.get("releases", {}))
    fails, shape, skipped = set(), set(), set()
    for finding in m.exports:
        f = data["findings"].get(finding, {})
        fails |= set(f.get("range", {}).get("fails_on", []))
        skipped |= set(f.get("range", {}).get("skipped_on", {}))
        shape |= {v for v, ok in f.get("code_shape", {}).items() if ok}
    fails_l = [v for v in order if v in fails]
    shape_l = [v for v in order if v in shape]
    skip_l = [v for v in order if v in skipped]
    return (
        f"Affected releases (computed over the {len(order)} installed, {_span(order)}): the "
        f"unit test fails on {_span(fails_l)}; it does not run on {', '.join(skip_l) or 'none'} "
        f"(reasons below); every step of the mechanism is in the source of {_span(shape_l)}."
    )


def _range_section(m: Mechanism) -> list[str]:
    data = _json(EXPORTS / "release-range.json")
    out = ["## Release range (computed)", ""]
    if not data:
        return out + ["`samples/exports/release-range.json` is missing: not computed.", ""]
    releases = list(data.get("releases", {}))
    out += [
        "Each export's test run with plain pytest in every SGLang release installed here "
        "(`bench/export_release_range.py`, its output `samples/exports/release-range.json`); "
        "`code shape` says whether every step of the mechanism above is in that release's "
        "source (read with `ast`, not run):",
        "",
        "| test | " + " | ".join(releases) + " |",
        "|---|" + "---|" * len(releases),
    ]
    for finding in m.exports:
        f = data["findings"].get(finding)
        if f is None:
            out.append(f"| `{finding}` | " + " | ".join("not run" for _ in releases) + " |")
            continue
        cells = []
        for v in releases:
            run = f["runs"].get(v, {})
            shape = f.get("code_shape", {}).get(v)
            word = run.get("outcome", "not run")
            if word == "skipped":
                word = "skipped"
            cells.append(f"{word}{' (code shape: yes)' if shape else ''}")
        out.append(f"| `{finding}/` | " + " | ".join(cells) + " |")
    out.append("")
    for finding in m.exports:
        f = data["findings"].get(finding)
        if f:
            out.append(f"- `{finding}/`: {f['sentence']}.")
    tree = data.get("dense_hicache_tree") or {}
    if m.name == "write-through" and tree:
        per = ", ".join(f"{v}: {c}" for v, c in tree.items() if c)
        out += [
            f"- The tree cache a dense model gets with `--enable-hierarchical-cache`, read off "
            f"each release's `mem_cache/registry.py`: {per}.",
        ]
    out += _runs_by_release(m)
    parts = data.get("parts") or [{"started": data.get("started"), "host": data.get("host")}]
    when = "; ".join(
        f"{p['started']}, {p['host'].get('cores')} cores at load "
        f"{p['host'].get('load_at_start')}-{p['host'].get('load_at_end')}"
        for p in parts
    )
    out += ["", f"Run in {len(parts)} part(s): {when}.", ""]
    return out


def _said(said: list[str]) -> str:
    """The failure as the test words it: its assertion message when it has one, else the
    exception line."""
    if not said:
        return ""
    message = next((s.split(" : ", 1)[1] for s in said if " : " in s), None)
    return f': `{said[0].split(":", 1)[0]}`, "{message}"' if message else f": `{said[0]}`"


def _runs_by_release(m: Mechanism) -> list[str]:
    """The committed real-engine runs whose evidence names this mechanism, by release."""
    from hicache_diag.export.evidence_tags import run_tags

    evidence = set(_recipe(m.recipe).evidence)
    found: dict[str, list[str]] = {}
    dirs = [*ROOT.glob("samples/runs/*"), *ROOT.glob("samples/hunt/*/runs/*")]
    dirs += list(ROOT.glob("samples/bisect/*/runs/*"))
    for run in sorted(d for d in dirs if (d / "manifest.json").is_file()):
        if not evidence & set(run_tags(run)):
            continue
        version = (_json(run / "manifest.json").get("sglang") or {}).get("version", "?")
        verdict = _json(run / "verdict.json")
        found.setdefault(version, []).append(
            f"`{run.relative_to(ROOT)}` ({verdict.get('outcome')}"
            + (f", form {verdict['form']}" if verdict.get("form") else "")
            + ")"
        )
    if not found:
        return []
    out = [
        f"- Committed runs of the real server whose evidence names this mechanism "
        f"({'/'.join(sorted(evidence))} apart across ranks), by release:"
    ]
    for v, runs in sorted(found.items()):
        more = f" and {len(runs) - 2} more" if len(runs) > 2 else ""
        out.append(f"  - {v}: {len(runs)} run(s): {', '.join(runs[:2])}{more}")
    return out


def _unit_section(m: Mechanism, recipe) -> list[str]:
    raw = (EXPORTS / "patch-check-0.5.23.json").read_text()
    check = {f["finding"]: f for f in json.loads(raw)}
    out = ["## The unit test", ""]
    for finding in m.exports:
        test = next(p.name for p in sorted((EXPORTS / finding).glob("test_*.py")))
        out.append(f"`samples/exports/{finding}/{test}` (plain pytest, nothing of ours imported):")
        runs = (check.get(finding) or {}).get("runs", {})
        for kind, label in (
            ("release", "0.5.23 as released"),
            ("nonfix", "`nonfix.patch`"),
            ("fix", "`fix.patch`"),
        ):
            run = runs.get(kind)
            if run:
                out.append(f"- {label}: {run['outcome']}{_said(run.get('said') or [])}")
        out.append("")
    out += [f"Invariant: {recipe.invariant}", ""]
    return out


def render(m: Mechanism) -> str:
    recipe = _recipe(m.recipe)
    package = _package_0523()
    fix = EXPORTS / m.exports[0] / "fix.patch"
    head, diff = _patch_body(fix)
    lines = [
        f"# {recipe.title} (SGLang 0.5.23)",
        "",
        f"For: {m.to}.",
        "",
        m.opening,
        "",
        range_headline(m),
        "",
        "## Mechanism (file:line in 0.5.23)",
        "",
        *mechanism_lines(recipe, package, "0.5.23"),
        "",
    ]
    lines += _unit_section(m, recipe)
    lines += _bisect_section(m)
    lines += ["## The candidate fix", "", recipe.fix, "", "<details><summary>fix.patch</summary>"]
    lines += ["", "```diff", diff.rstrip(), "```", "", "</details>", ""]
    lines += ["Its header (idea, cost, limit):", "", *[f"> {ln}" for ln in head.splitlines()], ""]
    lines += _cost_section(m)
    lines += ["## A non-fix the test rejects", "", recipe.nonfix, ""]
    lines += _range_section(m)
    lines += ["## Related threads", "", "| thread | state | what |", "|---|---|---|"]
    lines += [f"| [{r.ref}]({r.url}) | {r.state} | {r.why} |" for r in recipe.related]
    lines += [f"| [{ref}]({_PULL}{ref[1:]}) | {st} | {why} |" for ref, st, why in m.extra_threads]
    lines += [
        "",
        "## How this report was made",
        "",
        "By `python bench/mechanism_report.py "
        f"{m.name}` from the committed evidence named above (hicache-diag, issue 39); each "
        "figure is read from those files.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mechanisms", nargs="+", choices=sorted(MECHANISMS))
    parser.add_argument("--out", type=Path, default=ROOT / "samples" / "reports")
    args = parser.parse_args(argv)
    for name in args.mechanisms:
        target = args.out / name / "REPORT.md"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(render(MECHANISMS[name]))
        print(target)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
