"""What SGLang an interpreter holds, and whether it can serve `--engine sglang`.

`probe_sglang(python)` asks an interpreter (ours, or `--sglang-python`) where its SGLang lives,
which release it is and what that environment holds, without importing SGLang (an import costs
seconds and, on a CPU host, needs the plugin's shims first). `preflight` then reads that source
and environment: the plugin's targets must be there, and so must every requirement the release
needs here (a broken venv is refused before launch, naming the package). Installing a release
is install.py's (the command) and cpu_install.py's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from hicache_diag.engines.sglang import requirements as R
from hicache_diag.engines.sglang.launch_facts import LaunchFacts, read_launch_facts
from hicache_diag.engines.sglang.plugin.cpu_kernels import scan_cpu_kernel_names
from hicache_diag.engines.sglang.plugin.targets import missing_points, scan_targets
from hicache_diag.errors import UsageError

DEFAULT_VERSION = "0.5.23"
# Written beside the release (its site-packages) by the installer: what it left out and why.
RECORD_NAME = "hicache-diag-sglang-install.json"

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
        return {
            "python": self.python,
            "version": self.version,
            "package_dir": str(self.package_dir),
            "torch": self.torch,
            "transformers": self.transformers,
            "tokenizers": self.tokenizers,
            "left_out": self.record.get("dropped", {}),
            "launch_facts": self.launch.to_json(),
        }


def fix_command(python: str, version: str | None = None) -> str:
    tail = f" --version {version}" if version and version != "unknown" else ""
    return f"{python} -m hicache_diag.engines.sglang.install --python {python}{tail}"


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
        "python -m hicache_diag.engines.sglang.install"
        f" --python {venv}/bin/python --version {version}"
    )


def run_probe(python: str, flag: str = "--sglang-python") -> dict:
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
    info = run_probe(python, flag)
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
    launch = read_launch_facts(install.package_dir)
    return replace(install, cpu_kernel_names=names, missing_points=points, launch=launch)


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
        why = fault.sglang_refusal(install.version)
        if why:
            raise UsageError(f"fault {fault.NAME!r} cannot run on sglang {install.version}: {why}")
        for point in fault.POINTS:
            if point in install.missing_points:
                raise UsageError(
                    f"fault {fault.NAME!r} cannot run on sglang {install.version} "
                    f"(hook point {point!r}): {install.missing_points[point]}"
                )


def scheduler_import_error(install: SglangInstall) -> str | None:
    """None when the release's scheduler imports as a CPU launch would; else the error line."""
    install = preflight(install, cpu=True)
    from hicache_diag.engines.sglang.bundle import run_offline

    done = run_offline(install.python, "check-import", json.dumps(install.cpu_kernel_names))
    if done.returncode == 0:
        return None
    missing = missing_package_error(install.python, done.stderr)
    if missing is not None:
        raise missing
    return (done.stderr.strip().splitlines() or ["(no output)"])[-1][:300]
