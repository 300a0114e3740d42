"""Install a release on a CPU host: `python -m hicache_diag.engines.sglang.install`
(install.py) calls `install_cpu`, which drives pip in the target interpreter (requirements.py
decides, from metadata, what a CPU host installs), records what it left out and why beside the
release, and calls it installed only once that interpreter imports SGLang's scheduler.
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
import time
import zipfile
from pathlib import Path

from packaging.utils import canonicalize_name

from hicache_diag.engines.sglang import requirements as R
from hicache_diag.engines.sglang.release import (
    RECORD_NAME,
    SglangInstall,
    probe_sglang,
    run_probe,
    scheduler_import_error,
)
from hicache_diag.errors import UsageError

# A measured incompatibility, not a CPU matter: 0.5.12.post1's unpinned `kernels` resolves today
# to 0.17, whose LayerRepository needs a revision its pinned transformers 5.6 does not pass;
# held at the release 0.5.13's resolution picked.
COMPAT_PINS: dict[str, tuple[str, ...]] = {"0.5.12.post1": ("kernels==0.14.1",)}

MAX_PREPARE_ROUNDS = 8  # each round drops one requirement pip could not prepare


class _Pip:
    """pip in the target interpreter, its output kept in one log (printed only on failure)."""

    def __init__(self, python: str, log: Path, say) -> None:
        self.python, self.log, self.say = python, log, say

    def __call__(self, *args: str) -> subprocess.CompletedProcess:
        cmd = [self.python, "-m", "pip", *args]
        with open(self.log, "a") as fh:
            fh.write(f"\n$ {' '.join(cmd)}\n")
            fh.flush()
            done = subprocess.run(
                cmd,
                stdout=fh,
                stderr=subprocess.STDOUT,
                text=True,
                check=False,
                stdin=subprocess.DEVNULL,
            )
        return done

    def output_since(self, mark: int) -> str:
        return self.log.read_text(errors="replace")[mark:]

    def mark(self) -> int:
        return len(self.log.read_text(errors="replace")) if self.log.exists() else 0

    def last_error(self, mark: int) -> str:
        lines = [ln.strip() for ln in self.output_since(mark).splitlines() if ln.strip()]
        errs = [ln for ln in lines if ln.startswith("ERROR") or ln.startswith("error")]
        return (errs or lines or ["(no output)"])[-1][:300]


def _download_wheel(pip: _Pip, version: str, into: Path) -> Path:
    mark = pip.mark()
    done = pip("download", "--no-deps", f"sglang=={version}", "-d", str(into))
    wheels = list(into.glob("sglang-*.whl"))
    if done.returncode != 0 or not wheels:
        raise UsageError(
            f"cannot download sglang=={version}: {pip.last_error(mark)} (log: {pip.log})"
        )
    return wheels[0]


def _prepare(
    pip: _Pip, plan: R.RequirementPlan, tmp: Path, constraints: Path, env: dict | None
) -> None:
    """Ask the index for each requirement's metadata (no install), dropping what pip cannot
    prepare here and what that metadata shows is CUDA-only."""
    for _ in range(MAX_PREPARE_ROUNDS):
        reqs, report = tmp / "requirements.txt", tmp / "report.json"
        reqs.write_text("\n".join(plan.install) + "\n")
        mark = pip.mark()
        done = pip(
            "install",
            "--dry-run",
            "--ignore-installed",
            "--no-deps",
            "--quiet",
            "--report",
            str(report),
            "-r",
            str(reqs),
            "-c",
            str(constraints),
        )
        if done.returncode != 0:
            failure = R.parse_pip_failure(pip.output_since(mark))
            if failure is None or not plan.drop(failure.package, failure.reason):
                raise UsageError(
                    f"pip cannot read the requirements of this release: {pip.last_error(mark)} "
                    f"(log: {pip.log})"
                )
            continue
        # --no-deps: each requirement's metadata stands alone, so one report decides them all.
        for item in json.loads(report.read_text()).get("install", []):
            meta = item.get("metadata", {})
            why = R.gpu_only_by_metadata(meta, env)
            if why:
                plan.drop(meta.get("name", ""), f"CUDA-only: {why}")
        return
    raise UsageError(
        f"gave up after {MAX_PREPARE_ROUNDS} rounds of requirements pip could "
        f"not prepare (log: {pip.log})"
    )


def _install_requirements(pip: _Pip, plan: R.RequirementPlan, tmp: Path, constraints: Path) -> None:
    """The kept requirements with their own dependencies; a dependency pip cannot prepare drops
    the requirement that brought it in."""
    for _ in range(MAX_PREPARE_ROUNDS):
        reqs = tmp / "requirements.txt"
        reqs.write_text("\n".join(plan.install) + "\n")
        mark = pip.mark()
        done = pip("install", "-r", str(reqs), "-c", str(constraints))
        if done.returncode == 0:
            return
        failure = R.parse_pip_failure(pip.output_since(mark))
        top = failure.parents[-1] if failure and failure.parents else None
        why = f"needs {failure.package}: {failure.reason}" if failure else ""
        if failure is None or not plan.drop(top or failure.package, why):
            raise UsageError(
                f"pip could not install the release's requirements: {pip.last_error(mark)} "
                f"(log: {pip.log})"
            )
    raise UsageError(f"gave up installing after {MAX_PREPARE_ROUNDS} rounds (log: {pip.log})")


def install_cpu(python: str, version: str, say=print) -> SglangInstall:
    target = run_probe(python, "--python")
    torch = target.get("torch")
    if not torch:
        raise UsageError(f"{python} has no torch; install torch==2.13.0 (CPU build) first")
    log_dir = Path(tempfile.gettempdir()) / "hicache-diag-install"
    log_dir.mkdir(exist_ok=True)
    pip = _Pip(python, log_dir / f"sglang-{version}-{int(time.time())}.log", say)
    dropped = _install_release(pip, version, torch, target)
    install = _write_record(probe_sglang(python), version, torch, dropped)
    for _ in range(MAX_PREPARE_ROUNDS):
        say(f"sglang {version}: checking that its scheduler imports")
        error = scheduler_import_error(install)
        if error is None:
            return install
        dist = _unloadable_native_dist(install, error)
        if dist is None:
            raise UsageError(
                f"sglang {version} installed for {python}, but its scheduler does "
                f"not import: {error}"
            )
        # Built against another torch (its metadata does not say so): its library cannot load
        # beside the CPU build, and the scheduler imports it only when it is there.
        say(f"sglang {version}: removing {dist}, whose native library does not load here")
        pip("uninstall", "-y", dist)
        dropped[dist] = f"its native library does not load against torch {torch} ({error})"
        install = _write_record(probe_sglang(python), version, torch, dropped)
    return install


def _install_release(pip: _Pip, version: str, torch: str, target: dict) -> dict[str, str]:
    """The release's kept requirements, torchvision and its wheel, installed; what was left out
    -> why."""
    say = pip.say
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        say(f"sglang {version}: downloading its wheel (pip log: {pip.log})")
        wheel = _download_wheel(pip, version, tmp)
        with zipfile.ZipFile(wheel) as zf:
            meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
            requires = R.requires_dist(zf.read(meta).decode())
        env = target.get("marker_env")
        plan = R.plan_requirements(requires, env)
        constraints = tmp / "constraints.txt"
        pins = "".join(f"{pin}\n" for pin in COMPAT_PINS.get(version, ()))
        constraints.write_text(f"torch=={torch}\n{pins}")
        say(f"sglang {version}: reading the metadata of its {len(plan.install)} requirements")
        _prepare(pip, plan, tmp, constraints, env)
        say(
            f"sglang {version}: installing {len(plan.install)} requirements; "
            f"{len(plan.dropped)} left out (torch held at {torch}, CUDA-only or not "
            f"installable here)"
        )
        _install_requirements(pip, plan, tmp, constraints)
        # torchvision: a CUDA build is all the index has; the plugin empties its one
        # CUDA-only submodule, and nothing else of it needs the CUDA library.
        for args in (
            ("--no-deps", f"torchvision=={torchvision_for(torch)}"),
            ("--no-deps", "--force-reinstall", str(wheel)),
        ):
            mark = pip.mark()
            if pip("install", *args).returncode != 0:
                raise UsageError(
                    f"pip install {args[-1]} failed: {pip.last_error(mark)} (log: {pip.log})"
                )
    return {d.name: d.reason for d in plan.dropped}


def _write_record(
    install: SglangInstall, version: str, torch: str, dropped: dict[str, str]
) -> SglangInstall:
    record = {"sglang": version, "torch": torch, "dropped": dropped}
    root = install.dist_root or install.site_root
    (root / RECORD_NAME).write_text(json.dumps(record, indent=1, sort_keys=True))
    return probe_sglang(install.python)


_NATIVE_LOAD = re.compile(r"(?:OSError|ImportError).*?site-packages/(?P<top>[A-Za-z0-9_]+)/\S*\.so")


def _unloadable_native_dist(install: SglangInstall, error: str) -> str | None:
    """The distribution whose shared library failed to load in `error`, or None."""
    m = _NATIVE_LOAD.search(error)
    if not m:
        return None
    script = "import importlib.metadata as m, json; print(json.dumps(m.packages_distributions()))"
    done = subprocess.run(
        [install.python, "-c", script], capture_output=True, text=True, check=False, timeout=60
    )
    if done.returncode != 0:
        return None
    dists = json.loads(done.stdout).get(m.group("top")) or []
    return dists[0] if dists and canonicalize_name(dists[0]) != "sglang" else None


def torchvision_for(torch: str) -> str:
    """The torchvision release built against `torch` (2.13.x -> 0.28.0)."""
    major, minor = (int(x) for x in torch.split("+")[0].split(".")[:2])
    return f"0.{minor + 15}.0" if major == 2 else "0.28.0"
