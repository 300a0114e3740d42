"""A `bisect --switch patch=none,FILE` run, summed up: per trial what its verdict and manifest
say, per cell the divergence rate with its Wilson interval and the cache's hit counts.

    python bench/bisect_patch_summary.py RUN_DIR [--trials-json OUT] [--markdown] [--partial]

RUN_DIR is bisect's --out (its table.json and one run dir per trial). Per trial: the patch
(the manifest's `sglang.patch`: file and sha256, none for the release as it is), outcome, form,
duration, whether it ran on a reused warm server and why, the first divergence (step, field,
source) and each rank's cache counts from the verdict (`prefix_hit`: tokens served from the
device tree, `host_hit`: from host memory). Per cell: trials, divergences (any outcome but ok),
the rate's 95% Wilson interval and its upper bound, and the cache counts summed over the cell's
ok trials, per rank. Prints JSON, or with --markdown the two tables a report quotes.
--partial reads an interrupted bisect (no table.json): its run dirs as found, a trial with no
verdict undecided, and no tool verdict.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    if n == 0:
        return 0.0, 1.0
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, mid - half), min(1.0, mid + half)


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _short(path: str | None) -> str:
    """The patch as the repo names it (`samples/exports/...`), or none."""
    if not path:
        return "none"
    return "samples/" + path.split("/samples/", 1)[1] if "/samples/" in path else path


def trial_facts(run: Path, cell: str) -> dict:
    verdict, manifest = _json(run / "verdict.json"), _json(run / "manifest.json")
    warm = manifest.get("warm_server") or {}
    patch = (manifest.get("sglang") or {}).get("patch") or {}
    fd = verdict.get("first_divergence") or {}
    return {
        "cell": cell,
        "trial": run.name,
        "patch": _short(patch.get("file")),
        "patch_sha256": patch.get("sha256"),
        "outcome": verdict.get("outcome", "undecided"),
        "form": verdict.get("form"),
        "duration_s": verdict.get("duration_s"),
        "reused": bool(warm.get("reused")),
        "why": warm.get("why"),
        "first_divergence": (
            {"step": fd.get("step"), "field": fd.get("field"), "source": fd.get("source")}
            if fd
            else None
        ),
        "cache": verdict.get("cache") or {},
        "faults": manifest.get("faults") or [],
    }


def summarize(root: Path) -> dict:
    trials = [
        trial_facts(run, cell.name)
        for cell in sorted(root.glob("cell*"))
        for run in sorted(cell.glob("trial*"), key=lambda p: int(p.name[5:].split("-")[0]))
    ]
    cells = {}
    for t in trials:
        c = cells.setdefault(t["cell"], {"patch": t["patch"], "trials": 0, "divergences": 0})
        c.setdefault("forms", {})
        c.setdefault("cache_ok_trials", {})
        c.setdefault("ok_trials", 0)
        c.setdefault("reused", 0)
        if t["outcome"] == "undecided":
            c["undecided"] = c.get("undecided", 0) + 1
            continue
        c["trials"] += 1
        c["reused"] += t["reused"]
        if t["outcome"] != "ok":
            c["divergences"] += 1
            key = t["form"] or t["outcome"]
            c["forms"][key] = c["forms"].get(key, 0) + 1
            continue
        c["ok_trials"] += 1
        for rank, counts in t["cache"].items():
            into = c["cache_ok_trials"].setdefault(rank, {})
            for k in ("prefix_hit", "host_hit"):
                into[k] = into.get(k, 0) + int(counts.get(k) or 0)
    for c in cells.values():
        lo, hi = wilson(c["divergences"], c["trials"])
        c["ci95"] = [round(lo, 3), round(hi, 3)]
        c["wilson_upper"] = round(hi, 3)
    table = _json(root / "table.json")
    return {"verdict": table.get("verdict", []), "cells": cells, "trials": trials}


def markdown(summary: dict) -> str:
    lines = [
        "| patch | diverged / trials | 95% interval (Wilson) | upper bound | forms "
        "| on a reused server |",
        "|---|---|---|---|---|---|",
    ]
    for c in summary["cells"].values():
        forms = ", ".join(f"{k} {n}" for k, n in sorted(c["forms"].items())) or "-"
        lo, hi = c["ci95"]
        lines.append(
            f"| {c['patch']} | {c['divergences']}/{c['trials']} | [{lo:.2f}, {hi:.2f}] | "
            f"{hi:.2f} | {forms} | {c['reused']} of {c['trials']} |"
        )
    lines += ["", "| patch | ok trials | " + "per rank: prefix_hit / host_hit (tokens, summed) |"]
    lines += ["|---|---|---|"]
    for c in summary["cells"].values():
        per = "; ".join(
            f"rank {r}: {v['prefix_hit']} / {v['host_hit']}"
            for r, v in sorted(c["cache_ok_trials"].items())
        )
        lines.append(f"| {c['patch']} | {c['ok_trials']} | {per or '-'} |")
    lines += ["", *[f"tool's verdict: {v}" for v in summary["verdict"]]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--trials-json", type=Path, help="write the per-trial facts here")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--partial", action="store_true", help="an interrupted bisect")
    args = parser.parse_args(argv)
    if not args.partial and not (args.run_dir / "table.json").is_file():
        print(f"{args.run_dir}: no table.json (not a finished bisect; --partial)", file=sys.stderr)
        return 2
    summary = summarize(args.run_dir)
    if args.trials_json:
        args.trials_json.write_text(json.dumps(summary["trials"], indent=1) + "\n")
    if args.markdown:
        print(markdown(summary), end="")
    else:
        print(json.dumps({k: v for k, v in summary.items() if k != "trials"}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
