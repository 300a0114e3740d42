"""`python -m hicache_diag.engines.sglang.install [--python PY] [--version V]`: install a release.

On a CPU host cpu_install.py drives pip (requirements.py decides, from metadata, what a CPU host
installs) and records what it left out and why beside the release; the release is called
installed only once that interpreter imports SGLang's scheduler with the release's own
requirements. What an interpreter holds is release.py's to find.
"""

from __future__ import annotations

import argparse
import sys
import time

from hicache_diag.engines.sglang.cpu_install import install_cpu
from hicache_diag.engines.sglang.release import (
    DEFAULT_VERSION,
    RECORD_NAME,
    SglangInstall,
    probe_sglang,
    scheduler_import_error,
)
from hicache_diag.errors import UsageError


def verify_release(install: SglangInstall, say=print) -> None:
    """Installed means: every requirement is there (or left out on purpose) and the release's
    scheduler imports. UsageError (exit 2) naming what is wrong otherwise."""
    say(f"sglang {install.version}: checking its requirements and that its scheduler imports")
    error = scheduler_import_error(install)
    if error:
        raise UsageError(
            f"sglang {install.version} at {install.python} is installed but its scheduler does "
            f"not import: {error}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hicache_diag.engines.sglang.install")
    parser.add_argument("--python", default=sys.executable, help="interpreter to install into")
    parser.add_argument("--version", default=DEFAULT_VERSION, help="SGLang release")
    parser.add_argument("--force", action="store_true", help="reinstall even if present")
    args = parser.parse_args(argv)
    t0 = time.time()

    def say(msg: str) -> None:
        print(f"[{time.time() - t0:4.0f} s] {msg}", flush=True)

    try:
        current = None
        try:
            current = probe_sglang(args.python, "--python")
        except UsageError as exc:
            if "not installed" not in str(exc):
                raise
        if current is not None and current.version == args.version and not args.force:
            try:
                verify_release(current, say)
                print(
                    f"sglang {current.version} already installed for {args.python} "
                    "(requirements and scheduler import checked)"
                )
                return 0
            except UsageError as exc:
                print(f"sglang {current.version} is there but incomplete ({exc}); repairing")
        install = install_cpu(args.python, args.version, say)  # ends on a scheduler import
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    left = install.record.get("dropped", {})
    print(
        f"sglang {install.version} installed for {args.python} in {time.time() - t0:.0f} s "
        f"({len(left)} requirements left out, recorded in "
        f"{(install.dist_root or install.site_root) / RECORD_NAME})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
