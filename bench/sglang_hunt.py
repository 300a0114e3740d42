"""The hunt budget (issue: the hunt as one command): `hicache-diag hunt --release 0.5.23
--budget 60m`, told nothing about what to find, must find the session-reap divergence (the
`session-close` / `session-timeout` triggers, no fault) and name no source divergent that its
fresh reruns did not confirm.

Runs the hunt (or, with --read DIR, reads a hunt already run), then prints per trigger: how
(natural or the fault), failed/trials, whether its reruns confirmed it; and ends with one line
`hunt 0.5.23: M min, T trials; session reap found and confirmed: yes|no; unconfirmed named
divergent: N`. Asserts nothing.

Usage: python bench/sglang_hunt.py [--release 0.5.23] [--budget 60m] [--out DIR] [--read DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

SESSION_REAP = ("session-close", "session-timeout")


def summary(hunt: dict) -> tuple[list[str], bool, int]:
    """(lines per trigger, session reap found and confirmed, divergent but unconfirmed)."""
    lines, reap, unconfirmed = [], False, 0
    for r in hunt.get("results", []):
        how = "natural" if r.get("natural") else f"fault {r.get('fault')}"
        how = how if r.get("trials") else "not run"
        divergent = bool(r.get("failures"))
        confirmed = r.get("confirmed")
        lines.append(
            f"  {r['trigger']:<16} {how:<40} {r.get('failures')}/{r.get('trials')} failed, "
            f"reruns {r.get('reruns') or '-'}, confirmed {confirmed}"
        )
        if r["trigger"] in SESSION_REAP and r.get("natural") and divergent and confirmed:
            reap = True
        unconfirmed += divergent and confirmed is not True
    return lines, reap, unconfirmed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--release", default="0.5.23")
    parser.add_argument("--budget", default="60m")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--read", type=Path, default=None, help="a hunt dir already run")
    args = parser.parse_args()
    wall = None
    out = args.read
    if out is None:
        out = args.out or Path(f"/tmp/hicache-diag-bench-hunt-{int(time.time())}")
        argv = [
            sys.executable, "-m", "hicache_diag.cli.main", "hunt", "--release", args.release,
            "--budget", args.budget, "--out", str(out),
        ]  # fmt: skip
        print("$", " ".join(argv), flush=True)
        t0 = time.time()
        subprocess.run(argv)
        wall = time.time() - t0
    hunt = json.loads((out / "hunt.json").read_text())
    lines, reap, unconfirmed = summary(hunt)
    print("\n".join(lines))
    took = "read" if wall is None else f"{wall / 60:.1f} min"
    print(
        f"hunt {args.release}: {took}, {hunt.get('trials_run')} trials; session reap found and "
        f"confirmed: {'yes' if reap else 'no'}; unconfirmed named divergent: {unconfirmed}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
