"""Time every malformed input of tests/cli/bad_inputs.py as a real `hicache-diag` subprocess:
exit code, stderr lines and seconds from exec to exit (the bound we aim for: under 2 s, before
any rank starts). Prints a table and the slowest case; never asserts on time.
Usage (from the repo root): python bench/bad_input.py  (or python -m bench.bad_input)
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the case table lives in tests/
from tests.cli.bad_inputs import BAD_INPUTS, expand, make_files  # noqa: E402

CLI = [sys.executable, "-m", "hicache_diag.cli.main"]


def main() -> None:
    import argparse

    argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0]).parse_args()
    with tempfile.TemporaryDirectory(prefix="bad-input-") as tmp:
        root = Path(tmp) / "files"
        make_files(root)
        rows = []
        for argv, want, _ in BAD_INPUTS:
            t0 = time.perf_counter()
            proc = subprocess.run([*CLI, *expand(argv, root)], capture_output=True, text=True,
                                  cwd=tmp, timeout=60)  # fmt: skip
            elapsed = time.perf_counter() - t0
            lines = len(proc.stderr.strip().splitlines())
            rows.append((elapsed, proc.returncode, want, lines, " ".join(argv)))
        for elapsed, rc, want, lines, args in rows:
            flag = "" if rc == want and lines == 1 else "  <-- unexpected"
            print(f"{elapsed:5.2f} s  exit {rc:3d} (want {want})  {lines} line(s)  {args}{flag}")
        slowest = max(rows)
        print(f"{len(rows)} cases; slowest {slowest[0]:.2f} s ({slowest[4]}); "
              f"all exit as expected with one line: "
              f"{all(r[1] == r[2] and r[3] == 1 for r in rows)}")  # fmt: skip


if __name__ == "__main__":
    main()
