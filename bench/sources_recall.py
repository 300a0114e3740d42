"""Sources recall: `hicache-diag sources` on SGLang 0.5.23 against the hand-checked list of its
per-rank reads (tests/data/sources_truth_0.5.23.toml).

    python bench/sources_recall.py --source /tmp/sgl/0.5.23     # an unzipped 0.5.23 wheel

Prints recall (list entries found at their file:line with the listed alignment, per mode where
the list gives modes), how many of those also name the listed decision, precision on the rows the
list judges (its reads, and the logical state that must not be listed as a physical source),
and every miss. The source tree: --source, else $HICACHE_DIAG_SGLANG_SRC. Never downloads.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

# The truth list and its scorer are test data (tests/unit/sources/truth.py), not product.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hicache_diag.sources.locate import source_tree  # noqa: E402
from hicache_diag.sources.scan import scan_tree  # noqa: E402
from tests.unit.sources.truth import load_truth, score  # noqa: E402

TRUTH = Path(__file__).resolve().parents[1] / "tests" / "data" / "sources_truth_0.5.23.toml"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", type=Path, default=os.environ.get("HICACHE_DIAG_SGLANG_SRC"))
    ap.add_argument("--truth", type=Path, default=TRUTH)
    args = ap.parse_args()
    if args.source is None:
        print("sources_recall: name the 0.5.23 tree (--source or $HICACHE_DIAG_SGLANG_SRC)")
        return 2
    truth = load_truth(args.truth)
    tree = source_tree(args.source)
    if tree.version != truth.version:
        print(f"sources_recall: {args.source} is sglang {tree.version}, the list {truth.version}")
        return 2
    start = time.process_time()
    inv = scan_tree(tree)
    took = time.process_time() - start
    s = score(inv, truth)
    n = s.total
    counts = f"{len(inv.sources)} sources, {len(inv.logical)} logical, {len(inv.files)} files"
    print(f"sglang {tree.version}: {counts}, scan {took:.1f} s CPU")
    print(f"recall      {len(s.aligned)}/{n} = {s.recall:.0%} (file:line, kind, alignment, modes)")
    print(f"  found     {len(s.found)}/{n} at file:line; decision also right {len(s.decided)}/{n}")
    judged = f"{len(s.found)} listed reads, {len(s.logical_as_source)} logical listed as sources"
    print(f"precision   {s.precision:.0%} on judged rows ({judged})")
    print(f"logical     {len(s.logical_missing)} of {len(truth.logical)} not in the logical list")
    for t in s.missed:
        print(f"  missed    {t.where} {t.function} ({t.kind})")
    for t, why in s.wrong:
        print(f"  wrong     {t.where} {t.function}: {why}")
    for where in s.logical_as_source:
        print(f"  logical listed as a source: {where}")
    for where in s.logical_missing:
        print(f"  logical not listed apart: {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
