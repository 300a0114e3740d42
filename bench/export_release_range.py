"""The release range of each committed export, computed: its test run with plain pytest against
every SGLang release installed here, and what each run said.

    HICACHE_DIAG_SGLANG_VENVS=/path/to/venvs python bench/export_release_range.py \\
        session-reap flush-deadline write-through-form-a --json samples/exports/release-range.json

The releases: this interpreter's SGLang (when it has one) and each venv
`$HICACHE_DIAG_SGLANG_VENVS/sglang-<version>/` (made by `python -m
hicache_diag.engines.sglang.install`). Each run copies the export to a temporary directory and
runs its test in the release's interpreter, cwd the copy, `PYTHONPATH` only pytest's own files
(a release venv holds no pytest), nothing of hicache-diag's: as a maintainer would run it.
A run's outcome is pytest's: `failed` (the invariant broken on that release, with the
assertion's message), `passed`, `skipped` (with the test's own reason: the code path it drives
is not in that release) or `error` (it did not run). The range is then read off the outcomes,
never typed: the releases the test fails on, passes on, and skips on with each reason.

Prints one JSON object (and writes it with --json): per finding, per release, the outcome and
what pytest printed for it, and the range. Slow: each run imports SGLang (a minute or more on a
loaded 2-core host).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXPORTS = ROOT / "samples" / "exports"
_TEST = re.compile(r"^test_.*\.py$")
# pytest, its packages and its top-level `py.py` (pytest 9 imports `py` from its own copy)
_PYTEST_FILES = ("pytest", "_pytest", "pluggy", "iniconfig", "py.py")
_VERSION = (
    "import importlib.metadata as m\ntry:\n    print(m.version('sglang'))\n"
    "except m.PackageNotFoundError:\n    print('')\n"
)


def _release_key(version: str) -> tuple:
    return tuple(int(p) if p.isdigit() else -1 for p in re.split(r"[.]|post", version) if p)


def releases() -> dict[str, str]:
    """version -> interpreter, for this one and every release venv, in version order."""
    found: dict[str, str] = {}
    candidates = [sys.executable]
    if root := os.environ.get("HICACHE_DIAG_SGLANG_VENVS"):
        candidates += sorted(str(p) for p in Path(root).glob("sglang-*/bin/python"))
    for python in candidates:
        done = subprocess.run(
            [python, "-c", _VERSION], capture_output=True, text=True, timeout=120, check=False
        )
        version = done.stdout.strip()
        if done.returncode == 0 and version:
            found.setdefault(version, python)
    return dict(sorted(found.items(), key=lambda kv: _release_key(kv[0])))


def _pytest_only(tmp: Path) -> Path:
    import pytest

    shim = tmp / "pytest-only"
    if not shim.is_dir():
        shim.mkdir(parents=True)
        site = Path(pytest.__file__).resolve().parents[1]
        for name in _PYTEST_FILES:
            (shim / name).symlink_to(site / name)
    return shim


def run_test(export: Path, python: str, tmp: Path) -> dict:
    """One export's test in one release's interpreter: pytest's outcome and what it said."""
    test = next(p for p in sorted(export.iterdir()) if _TEST.match(p.name))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HICACHE_DIAG", "VIRTUAL"))}
    env.update(PYTHONPATH=str(_pytest_only(tmp)), PYTHONDONTWRITEBYTECODE="1", PYTHONNOUSERSITE="1")
    argv = [python, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider", "-W", "ignore"]
    argv += ["--rootdir", str(export), str(test)]
    t0 = time.time()
    ran = subprocess.run(
        argv, capture_output=True, text=True, timeout=1800, cwd=export, env=env, check=False
    )
    text = ran.stdout + ran.stderr
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|error)", text)}
    if counts.get("failed"):
        outcome = "failed"
    elif counts.get("error") or ran.returncode not in (0, 5):
        outcome = "error"
    elif counts.get("passed"):
        outcome = "passed"
    else:
        outcome = "skipped" if counts.get("skipped") else "error"
    said = [
        ln[1:].strip()
        for ln in text.splitlines()
        if re.match(r"E\s", ln) and ("Error" in ln or " : " in ln)
    ]
    skips = [
        m.group(1).strip() for m in re.finditer(r"^SKIPPED \[\d+\] [^:]+:\d+: (.*)$", text, re.M)
    ]
    return {
        "outcome": outcome,
        "counts": counts,
        "said": list(dict.fromkeys(said))[:4],
        "skip_reasons": list(dict.fromkeys(skips)),
        "seconds": round(time.time() - t0, 1),
        "tail": text.strip().splitlines()[-1:] if outcome == "error" else [],
    }


def package_dir(python: str) -> Path | None:
    done = subprocess.run(
        [python, "-c", "import importlib.util as u; print(u.find_spec('sglang').origin)"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    origin = done.stdout.strip()
    return Path(origin).parent if done.returncode == 0 and origin else None


def code_shape(test_file: str, packages: dict[str, Path | None]) -> dict[str, bool | None]:
    """Per release: whether every step of the mechanism (the export recipe whose test this is)
    is in that release's source, read with `ast`, never imported (None: no source)."""
    sys.path.insert(0, str(ROOT))
    from hicache_diag.export.recipes import RECIPES
    from hicache_diag.export.source_lines import present

    recipe = next((r for r in RECIPES if r.test_file == test_file), None)
    if recipe is None:
        return {}
    return {v: (present(p, recipe.steps) if p else None) for v, p in packages.items()}


def dense_tree_cache(package: Path | None) -> str | None:
    """The tree cache a dense model gets with --enable-hierarchical-cache in that release, read
    off its `mem_cache/registry.py` (0.5.18 builds HiRadixCache there; later releases only
    UnifiedRadixCache). None: no source."""
    if package is None or not (package / "srt" / "mem_cache" / "registry.py").is_file():
        return None
    text = (package / "srt" / "mem_cache" / "registry.py").read_text()
    return "HiRadixCache" if "HiRadixCache(" in text else "UnifiedRadixCache"


def release_range(runs: dict[str, dict]) -> dict:
    """The range, read off the outcomes."""
    by = {o: [v for v, r in runs.items() if r["outcome"] == o] for o in ("failed", "passed")}
    skipped = {
        v: "; ".join(r["skip_reasons"]) for v, r in runs.items() if r["outcome"] == "skipped"
    }
    errors = {v: " ".join(r["tail"]) for v, r in runs.items() if r["outcome"] == "error"}
    return {
        "fails_on": by["failed"],
        "passes_on": by["passed"],
        "skipped_on": skipped,
        "error_on": errors,
    }


def range_sentence(rng: dict) -> str:
    """One line for a report: `fails on 0.5.23; skipped on 0.5.18 (reason), ...`."""
    parts = []
    if rng["fails_on"]:
        parts.append(f"fails on {', '.join(rng['fails_on'])}")
    if rng["passes_on"]:
        parts.append(f"passes on {', '.join(rng['passes_on'])}")
    parts += [f"skipped on {v} ({why})" for v, why in rng["skipped_on"].items()]
    parts += [f"did not run on {v} ({why})" for v, why in rng["error_on"].items()]
    return "; ".join(parts) or "not run"


def merged(old: dict, new: dict) -> dict:
    """`old` with `new`'s releases added (or replaced), each finding's range read again; the
    host facts of each part kept under `parts`."""
    out = {**old, "releases": {**old.get("releases", {}), **new["releases"]}}
    out["releases"] = dict(sorted(out["releases"].items(), key=lambda kv: _release_key(kv[0])))
    out["dense_hicache_tree"] = {**old.get("dense_hicache_tree", {}), **new["dense_hicache_tree"]}
    parts = old.get("parts") or [{"started": old.get("started"), "host": old.get("host")}]
    out["parts"] = [*parts, {"started": new["started"], "host": new["host"]}]
    for finding, f in new["findings"].items():
        prev = old.get("findings", {}).get(finding, {"runs": {}, "code_shape": {}})
        runs = {**prev["runs"], **f["runs"]}
        runs = dict(sorted(runs.items(), key=lambda kv: _release_key(kv[0])))
        rng = release_range(runs)
        shape = {**prev.get("code_shape", {}), **f["code_shape"]}
        out.setdefault("findings", {})[finding] = {
            **f,
            "code_shape": dict(sorted(shape.items(), key=lambda kv: _release_key(kv[0]))),
            "runs": runs,
            "range": rng,
            "sentence": range_sentence(rng),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("findings", nargs="+", help="directories under samples/exports/")
    parser.add_argument("--json", help="write the result here too")
    parser.add_argument("--only", help="comma-separated versions to run (default: every one)")
    parser.add_argument(
        "--merge", help="a previous output: its runs of other releases are kept, these added"
    )
    args = parser.parse_args(argv)
    found = releases()
    if args.only:
        found = {v: p for v, p in found.items() if v in args.only.split(",")}
    if not found:
        print("no SGLang release here (this interpreter or $HICACHE_DIAG_SGLANG_VENVS)")
        return 2
    load = os.getloadavg()[0]
    result: dict = {
        "releases": found,
        "host": {"cores": os.cpu_count(), "load_at_start": round(load, 1)},
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "findings": {},
    }
    packages = {v: package_dir(py) for v, py in found.items()}
    result["dense_hicache_tree"] = {v: dense_tree_cache(p) for v, p in packages.items()}
    with tempfile.TemporaryDirectory(prefix="export-range-") as tmp:
        for finding in args.findings:
            test = next(
                p.name for p in sorted((EXPORTS / finding).iterdir()) if _TEST.match(p.name)
            )
            runs = {}
            for version, python in found.items():
                export = Path(tmp) / version / finding  # pytest may write into its rootdir
                shutil.copytree(EXPORTS / finding, export)
                runs[version] = run_test(export, python, Path(tmp))
                print(f"{finding} on {version}: {runs[version]['outcome']}", file=sys.stderr)
            rng = release_range(runs)
            result["findings"][finding] = {
                "test": test,
                "code_shape": code_shape(test, packages),
                "runs": runs,
                "range": rng,
                "sentence": range_sentence(rng),
            }
    result["host"]["load_at_end"] = round(os.getloadavg()[0], 1)
    if args.merge:
        result = merged(json.loads(Path(args.merge).read_text()), result)
    text = json.dumps(result, indent=2) + "\n"
    if args.json:
        Path(args.json).write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
