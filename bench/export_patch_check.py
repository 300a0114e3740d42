"""Run a committed export's test against the installed SGLang as it is, with its `nonfix.patch`
and with its `fix.patch`, and show which lines of each patch the test executed.

    python bench/export_patch_check.py session-reap flush-deadline write-through-form-a

For each finding under samples/exports/ the test runs three times with plain pytest in this
interpreter (cwd the export, `PYTHONPATH` only the patched copy of the release, nothing of
ours): on the release as it is, on a copy with `nonfix.patch` applied, on a copy with
`fix.patch` applied. A small pytest plugin (`-p`, written to a temporary directory) traces the
lines run in the patched files (imports included), in the test process and in the processes
it forks; each hunk
of a patch counts as executed when one of its added lines, or the line that follows one of its
removals, ran. The patched copy is the overlay `run --patch` launches (the release's tree of
symlinks with only the patched files copied and patch(1) applied), so the installed release is
never touched. Where the export has a `revert.yaml` (the fix in the shape of 0.5.23's
`SGLANG_DEBUG_REVERT_PR` registry), a fourth run applies it with SGLang's own source patcher at
start on top of `fix.patch`: the test should fail again, as on the release.

Prints one JSON object per finding: each run's outcome (`passed` / `failed`, and the failure
lines pytest printed), each patch's hunks with `executed`, and whether the fix and the non-fix
differ in outcome. Exit status 1 when a finding breaks the rule the export promises (fails on
the release, fails under the non-fix, the non-fix's hunks executed; passes under the fix when
`--expect-fix pass`; fails again under fix.patch with revert.yaml). Slow: each run imports
SGLang (tens of seconds on a loaded 2-core host).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXPORTS = ROOT / "samples" / "exports"
_TEST = re.compile(r"^test_.*\.py$")

_TRACER = """
import os, sys, threading

_FILES = set(os.environ["EXPORT_TRACE_FILES"].split(os.pathsep))
_OUT = os.environ["EXPORT_TRACE_OUT"]
_seen = set()


def _local(frame, event, arg):
    if event == "line":
        key = (frame.f_code.co_filename, frame.f_lineno)
        if key not in _seen:
            _seen.add(key)
            with open(_OUT, "a") as out:
                out.write(f"{key[0]}:{key[1]}\\n")
    return _local


def _global(frame, event, arg):
    return _local if frame.f_code.co_filename in _FILES else None


def pytest_configure(config):  # before collection imports the release's modules
    sys.settrace(_global)
    threading.settrace(_global)
"""

# Applies the export's revert.yaml with SGLang's own source patcher (what
# `SGLANG_DEBUG_REVERT_PR` does at a scheduler's start-up) before the test imports anything of
# the release; the forked ranks inherit the patched functions.
_REVERTER = """
import os


def pytest_configure(config):
    from sglang.srt.debug_utils.source_patcher import apply_patches_from_config

    with open(os.environ["EXPORT_REVERT_YAML"]) as fh:
        apply_patches_from_config(fh.read())
"""


def release_dir() -> Path:
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("no SGLang in this interpreter")
    return Path(list(spec.submodule_search_locations)[0])


def hunks(patch: str) -> list[dict]:
    """Each hunk: its file (as `sglang/...`), header, and the new-side lines it changes (added
    lines, and the line that follows each removal)."""
    out: list[dict] = []
    path = None
    new = 0
    for line in patch.splitlines():
        if line.startswith("+++ b/"):
            path = line.removeprefix("+++ b/").split("\t")[0]
        elif line.startswith("@@") and path:
            m = re.match(r"@@ -\d+(?:,\d+)? \+(\d+)(?:,\d+)? @@", line)
            new = int(m.group(1))
            out.append({"file": path, "hunk": line, "changed": []})
        elif out and path and not line.startswith(("---", "+++")):
            if line.startswith("+"):
                out[-1]["changed"].append(new)
                new += 1
            elif line.startswith("-"):
                out[-1]["changed"].append(new)
            else:
                new += 1
    for h in out:
        h["changed"] = sorted(set(h["changed"]))
    return out


def patched_copy(release: Path, patch: Path, root: Path) -> Path:
    """The release with `patch` applied: the overlay `run --patch` launches (a tree of
    symlinks with only the patched files copied; engines/sglang/patch_overlay.py), built into
    `root`'s cache so the check never shares one with a user's runs."""
    import importlib.metadata

    sys.path.insert(0, str(ROOT))
    os.environ["HICACHE_DIAG_CACHE"] = str(root.parent / "cache")
    from hicache_diag.engines.sglang.patch_overlay import patch_overlay
    from hicache_diag.errors import UsageError

    try:
        return patch_overlay(str(patch), importlib.metadata.version("sglang"), release).root
    except UsageError as exc:
        raise SystemExit(str(exc)) from None


def run_test(export: Path, path: str, env_extra: dict[str, str], plugin: bool | str) -> dict:
    test = next(p for p in sorted(export.iterdir()) if _TEST.match(p.name))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HICACHE_DIAG", "VIRTUAL"))}
    env.update(PYTHONPATH=path, PYTHONDONTWRITEBYTECODE="1", PYTHONNOUSERSITE="1", **env_extra)
    argv = [sys.executable, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider", "-W", "ignore"]
    if plugin:
        argv += ["-p", plugin if isinstance(plugin, str) else "_export_line_tracer"]
    argv += ["--rootdir", str(export), str(test)]
    ran = subprocess.run(argv, capture_output=True, text=True, timeout=1200, cwd=export, env=env)
    text = ran.stdout + ran.stderr
    summary = [ln for ln in text.splitlines() if re.search(r"\d+ (passed|failed|skipped)", ln)]
    failures = [ln.strip() for ln in text.splitlines() if ln.startswith(("FAILED", "ERROR"))]
    # What each failure said: the exception line and the assertion's own message.
    said = [
        ln[1:].strip()
        for ln in text.splitlines()
        if re.match(r"E\s", ln) and ("Error" in ln or " : " in ln)
    ]
    outcome = "passed" if ran.returncode == 0 else "failed"
    return {
        "outcome": outcome,
        "summary": summary[-1:] or [text[-500:]],
        "failures": failures,
        "said": list(dict.fromkeys(said)),
    }


def check(finding: str, release: Path, tmp: Path) -> dict:
    export = tmp / "exports" / finding  # a copy: pytest's plugins may write into its rootdir
    shutil.copytree(EXPORTS / finding, export)
    result: dict = {"finding": finding, "runs": {}}
    result["runs"]["release"] = run_test(export, "", {}, plugin=False)
    for kind in ("nonfix", "fix"):
        patch = export / f"{kind}.patch"
        if not patch.is_file():
            continue
        root = patched_copy(release, patch, tmp / kind / finding)
        plugin_dir = tmp / "plugin"
        plugin_dir.mkdir(exist_ok=True)
        (plugin_dir / "_export_line_tracer.py").write_text(_TRACER)
        listed = hunks(patch.read_text())
        files = sorted({str(root / h["file"]) for h in listed})
        trace = tmp / f"{kind}-{finding}.lines"
        env = {"EXPORT_TRACE_FILES": os.pathsep.join(files), "EXPORT_TRACE_OUT": str(trace)}
        run = run_test(export, f"{root}{os.pathsep}{plugin_dir}", env, plugin=True)
        ran = set(trace.read_text().splitlines()) if trace.is_file() else set()
        for h in listed:
            where = str(root / h["file"])
            h["executed"] = [n for n in h["changed"] if f"{where}:{n}" in ran]
        run["hunks"] = [
            {"file": h["file"], "hunk": h["hunk"], "executed": bool(h["executed"])} for h in listed
        ]
        result["runs"][kind] = run
    runs = result["runs"]
    revert = export / "revert.yaml"
    if "fix" in runs and revert.is_file():
        runs["fix+revert"] = reverted(export, release, tmp / "fix" / finding, revert)
    if "fix" in runs and "nonfix" in runs:
        result["fix_and_nonfix_differ"] = runs["fix"]["outcome"] != runs["nonfix"]["outcome"]
    return result


def reverted(export: Path, release: Path, where: Path, revert: Path) -> dict:
    """The test under fix.patch with revert.yaml applied at start, as SGLANG_DEBUG_REVERT_PR
    would: it should fail as on the release."""
    root = patched_copy(release, export / "fix.patch", where)
    plugin_dir = where.parent.parent / "reverter"
    plugin_dir.mkdir(parents=True, exist_ok=True)
    (plugin_dir / "_revert_pr_yaml.py").write_text(_REVERTER)
    env = {"EXPORT_REVERT_YAML": str(revert)}
    return run_test(export, f"{root}{os.pathsep}{plugin_dir}", env, plugin="_revert_pr_yaml")


def broken(result: dict, expect_fix: str) -> list[str]:
    runs = result["runs"]
    out = []
    if runs["release"]["outcome"] != "failed":
        out.append("passes on the release")
    nonfix = runs.get("nonfix")
    if nonfix is None or nonfix["outcome"] != "failed":
        out.append("no non-fix, or the test passes under it")
    elif not all(h["executed"] for h in nonfix["hunks"]):
        out.append("a non-fix hunk the test never executes")
    if expect_fix == "pass" and runs.get("fix", {}).get("outcome") != "passed":
        out.append("fails under fix.patch")
    if runs.get("fix+revert", {}).get("outcome") == "passed":
        out.append("passes under fix.patch with revert.yaml: the YAML does not revert the fix")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("findings", nargs="+", help="directories under samples/exports/")
    parser.add_argument("--expect-fix", choices=("pass", "any"), default="pass")
    args = parser.parse_args(argv)
    release = release_dir()
    status = 0
    with tempfile.TemporaryDirectory(prefix="export-patch-check-") as tmp:
        for finding in args.findings:
            result = check(finding, release, Path(tmp))
            result["broken"] = broken(result, args.expect_fix)
            status |= bool(result["broken"])
            print(json.dumps(result, indent=2), flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
