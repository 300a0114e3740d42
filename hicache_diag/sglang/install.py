"""Find, check and install real SGLang for `--engine sglang`.

`probe_sglang(python)` asks an interpreter (ours, or `--sglang-python`) where its SGLang lives,
which release it is and what that environment holds, without importing SGLang (an import costs
seconds and, on a CPU host, needs the plugin's shims first). `preflight` then reads that source
and environment: the plugin's targets must be there, and so must every requirement the release
needs here (a broken venv is refused before launch, naming the package).

`python -m hicache_diag.sglang.install [--python PY] [--version V]` installs a release on a CPU
host (requirements.py decides, from metadata, what a CPU host installs), records what it left
out and why beside the release, and calls it installed only once that interpreter imports
SGLang's scheduler with the release's own requirements.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from hicache_diag.errors import UsageError
from hicache_diag.sglang import requirements as R
from hicache_diag.sglang.launch_facts import LaunchFacts, read_launch_facts
from hicache_diag.sglang_plugin.cpu_kernels import scan_cpu_kernel_names
from hicache_diag.sglang_plugin.targets import missing_points, scan_targets

DEFAULT_VERSION = "0.5.23"
# Written beside the release (its site-packages) by the installer: what it left out and why.
RECORD_NAME = "hicache-diag-sglang-install.json"

# A measured incompatibility, not a CPU matter: 0.5.12.post1's unpinned `kernels` resolves today
# to 0.17, whose LayerRepository needs a revision its pinned transformers 5.6 does not pass;
# held at the release 0.5.13's resolution picked.
COMPAT_PINS: dict[str, tuple[str, ...]] = {"0.5.12.post1": ("kernels==0.14.1",)}

_PROBE = """
import importlib.metadata as md, importlib.util as u, json, os, sys
def ver(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None
out = {"python": sys.executable, "pyver": "%d.%d" % sys.version_info[:2],
       "torch": ver("torch"), "transformers": ver("transformers"), "tokenizers": ver("tokenizers")}
spec = u.find_spec("sglang")
if spec and spec.submodule_search_locations:
    pkg = list(spec.submodule_search_locations)[0]
    out["package_dir"] = pkg
    out["version"] = ver("sglang")
    try:
        out["requires"] = md.requires("sglang") or []
    except md.PackageNotFoundError:
        out["requires"] = []
    out["installed"] = sorted({(d.metadata["Name"] or "").lower() for d in md.distributions()})
    try:  # beside the distribution's metadata: what pip installed together
        out["dist_root"] = str(md.distribution("sglang").locate_file(""))
    except md.PackageNotFoundError:
        out["dist_root"] = os.path.dirname(pkg)
    record = os.path.join(out["dist_root"], RECORD_NAME)
    if os.path.isfile(record):
        with open(record) as fh:
            out["record"] = json.load(fh)
try:
    from packaging.markers import default_environment
    out["marker_env"] = default_environment()
except ImportError:
    pass
print(json.dumps(out))
""".replace("RECORD_NAME", repr(RECORD_NAME))


@dataclass(frozen=True, slots=True)
class SglangInstall:
    python: str
    version: str
    package_dir: Path
    torch: str | None = None
    cpu_kernel_names: dict[str, list[str]] = field(default_factory=dict)
    # Hook point -> why this release cannot serve it (a function it lacks); faults there are
    # refused before launch.
    missing_points: dict[str, str] = field(default_factory=dict)
    transformers: str | None = None
    tokenizers: str | None = None
    requires: tuple[str, ...] = ()
    installed: frozenset[str] = frozenset()
    record: dict = field(default_factory=dict)
    marker_env: dict[str, str] | None = None
    launch: LaunchFacts = field(default_factory=LaunchFacts)
    dist_root: Path | None = None  # where the distribution's metadata (and our record) live

    @property
    def site_root(self) -> Path:
        return self.package_dir.parent

    def facts(self) -> dict:
        """What the manifest says of the release."""
        return {"python": self.python, "version": self.version,
                "package_dir": str(self.package_dir), "torch": self.torch,
                "transformers": self.transformers, "tokenizers": self.tokenizers,
                "left_out": self.record.get("dropped", {}),
                "launch_facts": self.launch.to_json()}  # fmt: skip


def fix_command(python: str, version: str | None = None) -> str:
    tail = f" --version {version}" if version and version != "unknown" else ""
    return f"{python} -m hicache_diag.sglang.install --python {python}{tail}"


# Releases held side by side: `$HICACHE_DIAG_SGLANG_VENVS/sglang-<version>/` is a venv with that
# release installed (scenario files name a release, not a machine's path).
VENVS_ENV = "HICACHE_DIAG_SGLANG_VENVS"


def venv_python_for(version: str) -> str | None:
    """The interpreter of `$HICACHE_DIAG_SGLANG_VENVS/sglang-<version>`, when that venv exists."""
    root = os.environ.get(VENVS_ENV)
    if not root:
        return None
    python = Path(root) / f"sglang-{version}" / "bin" / "python"
    return str(python) if python.is_file() else None


def release_command(version: str) -> str:
    """The commands that give a venv holding `version` where venv_python_for finds it."""
    venv = f"${VENVS_ENV}/sglang-{version}"
    return (
        f"python -m venv {venv} && {venv}/bin/pip install torch==2.13.0 && "
        f"python -m hicache_diag.sglang.install --python {venv}/bin/python --version {version}"
    )


def _run_probe(python: str, flag: str = "--sglang-python") -> dict:
    try:
        done = subprocess.run(
            [python, "-c", _PROBE], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"{flag} {python}: cannot run it ({exc})") from None
    if done.returncode != 0:
        err = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise UsageError(f"{flag} {python}: not a working Python ({err})")
    return json.loads(done.stdout.strip().splitlines()[-1])


def probe_sglang(python: str | None = None, flag: str = "--sglang-python") -> SglangInstall:
    """Where SGLang is for `python`; UsageError (exit 2) with the fixing command when absent."""
    python = python or sys.executable
    info = _run_probe(python, flag)
    if not info.get("package_dir"):
        raise UsageError(
            f"SGLang is not installed for {python}; install it with: {fix_command(python)}"
        )
    return SglangInstall(
        python=python,
        version=info.get("version") or "unknown",
        package_dir=Path(info["package_dir"]),
        torch=info.get("torch"),
        transformers=info.get("transformers"),
        tokenizers=info.get("tokenizers"),
        requires=tuple(info.get("requires") or ()),
        installed=frozenset(canonicalize_name(n) for n in info.get("installed") or () if n),
        record=info.get("record") or {},
        marker_env=info.get("marker_env"),
        dist_root=Path(info["dist_root"]) if info.get("dist_root") else None,
    )


def missing_requirements(install: SglangInstall) -> list[str]:
    """The release's requirements (for this platform) that its environment lacks, less those
    the installer left out on purpose (recorded beside the release)."""
    left_out = {canonicalize_name(n) for n in install.record.get("dropped", {})}
    missing = []
    for text in install.requires:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        name = canonicalize_name(req.name)
        if not R.applies(req, install.marker_env) or name in left_out:
            continue
        if name not in install.installed:
            missing.append(req.name)
    return missing


def preflight(install: SglangInstall, *, cpu: bool) -> SglangInstall:
    """Refuse (exit 2) a release whose requirements, probe or shim targets are missing; note
    the hook points it lacks (only a fault on one of those is refused); list its CPU kernel
    imports."""
    lacking = missing_requirements(install)
    if lacking:
        more = f" (+{len(lacking) - 1} more)" if len(lacking) > 1 else ""
        raise UsageError(
            f"sglang {install.version} at {install.python} lacks its requirement "
            f"{lacking[0]!r}{more}; repair it with: {fix_command(install.python, install.version)}"
        )
    missing = scan_targets(install.site_root, roles="required")
    if missing:
        raise UsageError(
            f"sglang {install.version} ({install.package_dir}) lacks what hicache-diag hooks: "
            f"{missing[0]}" + (f" (+{len(missing) - 1} more)" if len(missing) > 1 else "")
        )
    names = scan_cpu_kernel_names(install.package_dir) if cpu else {}
    points = {
        p: f"needs {t}, which this release lacks"
        for p, t in missing_points(install.site_root).items()
    }
    if "now" not in points and _rust_tree_core(install.package_dir):
        points["now"] = (
            "this release's default Rust TreeCore stamps last_access_time inside its extension; "
            f"set {TREE_CORE_ENV}=python to run SGLang's Python TreeCore, where the clock is hooked"
        )
    from dataclasses import replace

    return replace(install, cpu_kernel_names=names, missing_points=points,
                   launch=read_launch_facts(install.package_dir))  # fmt: skip


def missing_package_error(python: str, stderr: str) -> UsageError | None:
    """The one-line error for an offline task that found a module missing in `python`."""
    for line in reversed(stderr.splitlines()):
        if line.startswith("missing-module: "):
            module = line.split(": ", 1)[1].strip()
            return UsageError(
                f"{python} cannot import {module!r}, which this needs (SGLang requires it); "
                f"repair that environment with: {fix_command(python)}"
            )
    return None


TREE_CORE_ENV = "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"


def _rust_tree_core(package_dir: Path) -> bool:
    """0.5.2x: the unified tree's core is a bundled Rust extension unless the env picks Python."""
    bundled = any((package_dir / "srt" / "mem_cache" / "rust_tree_core").glob("mem_cache*.so"))
    return bundled and os.environ.get(TREE_CORE_ENV, "rust") != "python"


def refuse_unhookable(install: SglangInstall, faults: tuple[str, ...]) -> None:
    """One line (exit 2) for the first fault whose hook point this release does not have."""
    from hicache_diag.faults.spec import parse_fault_spec

    for text in faults:
        fault = parse_fault_spec(text).build()
        why = fault.refusal("sglang", install.version)
        if why:
            raise UsageError(f"fault {fault.NAME!r} cannot run on sglang {install.version}: {why}")
        for point in fault.POINTS:
            if point in install.missing_points:
                raise UsageError(
                    f"fault {fault.NAME!r} cannot run on sglang {install.version} "
                    f"(hook point {point!r}): {install.missing_points[point]}"
                )


# -- installing a release on a CPU host --------------------------------------------------------
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
            done = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, text=True,
                                  check=False, stdin=subprocess.DEVNULL)  # fmt: skip
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


def _prepare(pip: _Pip, plan: R.RequirementPlan, tmp: Path, constraints: Path,
             env: dict | None) -> None:  # fmt: skip
    """Ask the index for each requirement's metadata (no install), dropping what pip cannot
    prepare here and what that metadata shows is CUDA-only."""
    for _ in range(MAX_PREPARE_ROUNDS):
        reqs, report = tmp / "requirements.txt", tmp / "report.json"
        reqs.write_text("\n".join(plan.install) + "\n")
        mark = pip.mark()
        done = pip("install", "--dry-run", "--ignore-installed", "--no-deps", "--quiet",
                   "--report", str(report), "-r", str(reqs), "-c", str(constraints))  # fmt: skip
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
    raise UsageError(f"gave up after {MAX_PREPARE_ROUNDS} rounds of requirements pip could "
                     f"not prepare (log: {pip.log})")  # fmt: skip


def _install_requirements(pip: _Pip, plan: R.RequirementPlan, tmp: Path,
                          constraints: Path) -> None:  # fmt: skip
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
        if failure is None or not plan.drop(top or failure.package,
                                            f"needs {failure.package}: {failure.reason}"):
            raise UsageError(
                f"pip could not install the release's requirements: {pip.last_error(mark)} "
                f"(log: {pip.log})"
            )
    raise UsageError(f"gave up installing after {MAX_PREPARE_ROUNDS} rounds (log: {pip.log})")


def install_cpu(python: str, version: str, say=print) -> SglangInstall:
    target = _run_probe(python, "--python")
    torch = target.get("torch")
    if not torch:
        raise UsageError(f"{python} has no torch; install torch==2.13.0 (CPU build) first")
    log_dir = Path(tempfile.gettempdir()) / "hicache-diag-install"
    log_dir.mkdir(exist_ok=True)
    pip = _Pip(python, log_dir / f"sglang-{version}-{int(time.time())}.log", say)
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
        say(f"sglang {version}: installing {len(plan.install)} requirements; "
            f"{len(plan.dropped)} left out (torch held at {torch}, CUDA-only or not "
            f"installable here)")  # fmt: skip
        _install_requirements(pip, plan, tmp, constraints)
        # torchvision: a CUDA build is all the index has; the plugin empties its one
        # CUDA-only submodule, and nothing else of it needs the CUDA library.
        for args in (("--no-deps", f"torchvision=={torchvision_for(torch)}"),
                     ("--no-deps", "--force-reinstall", str(wheel))):  # fmt: skip
            mark = pip.mark()
            if pip("install", *args).returncode != 0:
                raise UsageError(f"pip install {args[-1]} failed: {pip.last_error(mark)} "
                                 f"(log: {pip.log})")  # fmt: skip
    dropped = {d.name: d.reason for d in plan.dropped}
    install = _write_record(probe_sglang(python), version, torch, dropped)
    for _ in range(MAX_PREPARE_ROUNDS):
        say(f"sglang {version}: checking that its scheduler imports")
        error = scheduler_import_error(install)
        if error is None:
            return install
        dist = _unloadable_native_dist(install, error)
        if dist is None:
            raise UsageError(f"sglang {version} installed for {python}, but its scheduler does "
                             f"not import: {error}")  # fmt: skip
        # Built against another torch (its metadata does not say so): its library cannot load
        # beside the CPU build, and the scheduler imports it only when it is there.
        say(f"sglang {version}: removing {dist}, whose native library does not load here")
        pip("uninstall", "-y", dist)
        dropped[dist] = f"its native library does not load against torch {torch} ({error})"
        install = _write_record(probe_sglang(python), version, torch, dropped)
    return install


def _write_record(install: SglangInstall, version: str, torch: str,
                  dropped: dict[str, str]) -> SglangInstall:  # fmt: skip
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
    done = subprocess.run(
        [install.python, "-c", "import importlib.metadata as m, json; "
         "print(json.dumps(m.packages_distributions()))"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    if done.returncode != 0:
        return None
    dists = json.loads(done.stdout).get(m.group("top")) or []
    return dists[0] if dists and canonicalize_name(dists[0]) != "sglang" else None


def scheduler_import_error(install: SglangInstall) -> str | None:
    """None when the release's scheduler imports as a CPU launch would; else the error line."""
    install = preflight(install, cpu=True)
    from hicache_diag.sglang.bundle import run_offline

    done = run_offline(install.python, "check-import", json.dumps(install.cpu_kernel_names))
    if done.returncode == 0:
        return None
    missing = missing_package_error(install.python, done.stderr)
    if missing is not None:
        raise missing
    return (done.stderr.strip().splitlines() or ["(no output)"])[-1][:300]


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


def torchvision_for(torch: str) -> str:
    """The torchvision release built against `torch` (2.13.x -> 0.28.0)."""
    major, minor = (int(x) for x in torch.split("+")[0].split(".")[:2])
    return f"0.{minor + 15}.0" if major == 2 else "0.28.0"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hicache_diag.sglang.install")
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
                print(f"sglang {current.version} already installed for {args.python} "
                      "(requirements and scheduler import checked)")  # fmt: skip
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
    print(f"sglang {install.version} installed for {args.python} in {time.time() - t0:.0f} s "
          f"({len(left)} requirements left out, recorded in "
          f"{(install.dist_root or install.site_root) / RECORD_NAME})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
