"""Time every malformed input of tests/cli/bad_inputs.py as a real `hicache-diag` subprocess:
exit code, stderr lines and seconds from exec to exit (the bound we aim for: under 2 s, before
any rank starts). Prints a table, the cases over 2 s and the slowest; never asserts on time.
Usage (from the repo root): python bench/bad_input.py [--only numeric|paths|pairs|listed|probe]
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the case table lives in tests/
from tests.cli.bad_inputs import (  # noqa: E402
    BAD_INPUTS,
    GENERATED,
    PROBE_CASES,
    expand,
    make_files,
)

BOUND_S = 2.0  # the aim: every refusal within this, before anything starts

CLI = [sys.executable, "-m", "hicache_diag.cli.main"]


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    classes = ["listed", *GENERATED, "probe"]
    parser.add_argument(
        "--only",
        choices=classes,
        action="append",
        help="run only these classes (repeatable); default: all",
    )
    args = parser.parse_args()
    table = {"listed": BAD_INPUTS, **GENERATED, "probe": PROBE_CASES}
    chosen = [c for name in (args.only or classes) for c in table[name]]
    with tempfile.TemporaryDirectory(prefix="bad-input-") as tmp:
        root = Path(tmp) / "files"
        make_files(root)
        rows = []
        for argv, want, _ in chosen:
            t0 = time.perf_counter()
            proc = subprocess.run(
                [*CLI, *expand(argv, root)], capture_output=True, text=True, cwd=tmp, timeout=60
            )
            elapsed = time.perf_counter() - t0
            lines = len(proc.stderr.strip().splitlines())
            rows.append((elapsed, proc.returncode, want, lines, " ".join(argv)))
        for elapsed, rc, want, lines, args in rows:
            flag = "" if rc == want and lines == 1 else "  <-- unexpected"
            flag += f"  <-- over {BOUND_S:.0f} s" if elapsed > BOUND_S else ""
            print(f"{elapsed:5.2f} s  exit {rc:3d} (want {want})  {lines} line(s)  {args}{flag}")
        slowest = max(rows)
        over = sum(r[0] > BOUND_S for r in rows)
        print(
            f"{len(rows)} cases; slowest {slowest[0]:.2f} s ({slowest[4]}); "
            f"{over} over {BOUND_S:.0f} s; all exit as expected with one line: "
            f"{all(r[1] == r[2] and r[3] == 1 for r in rows)}"
        )


if __name__ == "__main__":
    main()
