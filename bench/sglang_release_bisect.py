"""The release-bisect budget (issue: trials in seconds): SGLang 0.5.19 vs 0.5.20 on the
waiting-timeout scenario, N trials a cell, through the `bisect` CLI, on warm servers
(`--warm-server`) or fresh ones.

Runs `hicache-diag bisect --engine sglang --sglang-version 0.5.19,0.5.20 --trials N
--scenario samples/scenarios/sglang/waiting_timeout_0.5.19.toml [--warm-server] --out DIR`
with the release venvs from `$HICACHE_DIAG_SGLANG_VENVS`, then reads DIR/table.json: each cell's
failures, interval and undecided count, how many trials ran on a reused server (their manifests'
`warm_server`), and the tool's own conclusion. Prints a table and ends with one line
`bisect 0.5.19 vs 0.5.20, N trials a cell (warm|fresh): M min; <conclusion>`. Asserts nothing.

`--pair l3` runs the other pair instead: 0.5.18 vs 0.5.19 on `l3_no_fault_0.5.18.toml` (the
L3 control-queue drain, fixed in 0.5.19).

Usage: python bench/sglang_release_bisect.py [--pair waiting|l3] [--trials 10] [--fresh]
       [--out DIR] [-- bisect flags]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "samples/scenarios/sglang"
# pair -> (releases, scenario)
PAIRS = {
    "waiting": ("0.5.19,0.5.20", SCENARIOS / "waiting_timeout_0.5.19.toml"),
    "l3": ("0.5.18,0.5.19", SCENARIOS / "l3_no_fault_0.5.18.toml"),
}


def reused(out: Path) -> tuple[int, int]:
    """(trials on a reused server, trials with a manifest) under the bisect's out dir."""
    manifests = list(out.rglob("manifest.json"))
    warm = 0
    for path in manifests:
        record = json.loads(path.read_text()).get("warm_server") or {}
        warm += bool(record.get("reused"))
    return warm, len(manifests)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", choices=sorted(PAIRS), default="waiting")
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--fresh", action="store_true", help="fresh servers (no --warm-server)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("bisect_args", nargs="*")
    args = parser.parse_args()
    if not os.environ.get("HICACHE_DIAG_SGLANG_VENVS"):
        print("set HICACHE_DIAG_SGLANG_VENVS to the folder of the release venvs (sglang-X.Y.Z/)")
        return 2
    how = "fresh" if args.fresh else "warm"
    versions, scenario = PAIRS[args.pair]
    out = args.out or Path(f"/tmp/hicache-diag-bench-bisect-{how}-{int(time.time())}")
    argv = [
        sys.executable, "-m", "hicache_diag.cli.main", "bisect", "--engine", "sglang",
        "--sglang-version", versions, "--trials", str(args.trials),
        "--scenario", str(scenario), "--out", str(out),
        *([] if args.fresh else ["--warm-server"]), *args.bisect_args,
    ]  # fmt: skip
    print("$", " ".join(argv), flush=True)
    t0 = time.time()
    rc = subprocess.run(argv).returncode
    wall = time.time() - t0
    table = json.loads((out / "table.json").read_text()) if (out / "table.json").exists() else {}
    print(f"\nbisect exit {rc}, {wall / 60:.1f} min, out {out}")
    releases = table.get("releases", {})
    for cell in table.get("cells", []):
        python = cell.get("values", {}).get("sglang-python", "?")
        print(
            f"  {releases.get(python, python):>10}: {cell.get('failures')}/{cell.get('trials')} "
            f"failed {cell.get('forms') or ''}, 95% {cell.get('ci95')}, "
            f"undecided {cell.get('undecided', 0)}, median TTF {cell.get('median_ttf_s')} s"
        )
    warm, total = reused(out)
    print(f"  trials on a reused server: {warm} of {total}")
    said = table.get("verdict") or "no verdict"
    print(
        f"bisect {versions.replace(',', ' vs ')}, {args.trials} trials a cell ({how}): "
        f"{wall / 60:.1f} min; {said}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
