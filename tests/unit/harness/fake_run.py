"""A stand-in for `hicache-diag run`: a real subprocess with a deterministic, argument-driven
outcome, so bisect's matrix, statistics, timeouts and Ctrl-C are tested without the runtime."""

import json
import os
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    opts, fixes = {}, []
    it = iter(argv)
    for arg in it:
        if arg == "--fix":
            fixes.append(next(it))
        elif arg in ("--bad", "--sleep", "--json"):
            opts[arg] = True
        elif arg.startswith("--"):
            opts[arg] = next(it)
    out, seed = Path(opts["--out"]), int(opts["--seed"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "pid").write_text(str(os.getpid()))
    if "--bad" in opts:
        sys.stderr.write("hicache-diag: error: unknown fault 'nope'; valid: dma-delay\n")
        return 2
    if "--sleep" in opts:
        time.sleep(60)
    legacy = "ack-count=local" in fixes or opts.get("--protocol") == "legacy"
    fail = legacy and (opts.get("--hicache-size") == "64MiB" or seed % 2 == 0)
    if opts.get("--storage-backend") == "file":
        fail = False
    if "sglang-0.5.18" in opts.get("--sglang-python", ""):  # a release axis: the old one fails
        fail = True
    verdict = {
        "schema": "hicache-diag/verdict/v1", "outcome": "crash" if fail else "ok",
        "form": "A" if fail else None, "duration_s": 1.0 + seed, "seed": seed,
    }  # fmt: skip
    (out / "verdict.json").write_text(json.dumps(verdict))
    print(json.dumps(verdict))
    return 10 if fail else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
