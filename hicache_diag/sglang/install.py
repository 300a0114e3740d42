"""Find, check and install real SGLang for `--engine sglang`.

`probe_sglang(python)` asks an interpreter (ours, or `--sglang-python`) where its SGLang lives
and which release it is, without importing it (an import costs seconds and, on a CPU host, needs
the plugin's shims first). `preflight` then reads that source: the plugin's targets must all be
there, and on CPU the `sgl_kernel` names SGLang imports are listed for the stand-in.

`python -m hicache_diag.sglang.install [--python PY] [--version V]` installs a release on a CPU
host: its wheel without dependencies, then its own requirements minus the CUDA-only ones, with
torch held at the CPU build already installed (SGLang pins a CUDA torch that cannot run here).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from hicache_diag.errors import UsageError
from hicache_diag.sglang_plugin.cpu_kernels import scan_cpu_kernel_names
from hicache_diag.sglang_plugin.targets import missing_points, scan_targets

DEFAULT_VERSION = "0.5.23"
# Requirements that exist only as CUDA builds (reference/sglang-on-cpu.md); none is imported on
# the CPU serving path.
CUDA_ONLY = re.compile(
    r"^(sglang-kernel|sgl-kernel|flashinfer.*|cuda-python|flash-attn.*|nvidia-.*|nvshmem4py.*|"
    r"quack-kernels|sgl-deep-ep|sgl-deep-gemm|sgl-flash-mla|tilelang|torchaudio|torchcodec|"
    r"timm|modelscope|humming-kernels|torch|torchvision|triton)$",
    re.IGNORECASE,
)

# Releases whose unpinned requirements resolve today to something their pinned transformers
# cannot import (kernels 0.17's LayerRepository needs a revision that transformers 5.6's
# hub_kernels does not pass): held at the release that 0.5.13's resolution picked.
COMPAT_PINS: dict[str, tuple[str, ...]] = {"0.5.12.post1": ("kernels==0.14.1",)}

_PROBE = """
import importlib.metadata as md, importlib.util as u, json, sys
spec = u.find_spec("sglang")
out = {"python": sys.executable, "pyver": "%d.%d" % sys.version_info[:2]}
if spec and spec.submodule_search_locations:
    out["package_dir"] = list(spec.submodule_search_locations)[0]
    try:
        out["version"] = md.version("sglang")
    except md.PackageNotFoundError:
        out["version"] = None
try:
    out["torch"] = md.version("torch")
except md.PackageNotFoundError:
    out["torch"] = None
print(json.dumps(out))
"""


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

    @property
    def site_root(self) -> Path:
        return self.package_dir.parent


def fix_command(python: str) -> str:
    return f"{python} -m hicache_diag.sglang.install --python {python}"


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


def probe_sglang(python: str | None = None) -> SglangInstall:
    """Where SGLang is for `python`; UsageError (exit 2) with the fixing command when absent."""
    python = python or sys.executable
    try:
        done = subprocess.run(
            [python, "-c", _PROBE], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"--sglang-python {python}: cannot run it ({exc})") from None
    if done.returncode != 0:
        raise UsageError(f"--sglang-python {python}: not a working Python ({done.stderr.strip()})")
    info = json.loads(done.stdout.strip().splitlines()[-1])
    if not info.get("package_dir"):
        raise UsageError(
            f"SGLang is not installed for {python}; install it with: {fix_command(python)}"
        )
    return SglangInstall(
        python=python,
        version=info.get("version") or "unknown",
        package_dir=Path(info["package_dir"]),
        torch=info.get("torch"),
    )


def preflight(install: SglangInstall, *, cpu: bool) -> SglangInstall:
    """Refuse (exit 2) a release whose probe or shim targets are gone; note the hook points it
    lacks (only a fault on one of those is refused); list its CPU kernel imports."""
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
    return SglangInstall(
        install.python, install.version, install.package_dir, install.torch, names, points
    )


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
        for point in fault.POINTS:
            if point in install.missing_points:
                raise UsageError(
                    f"fault {fault.NAME!r} cannot run on sglang {install.version} "
                    f"(hook point {point!r}): {install.missing_points[point]}"
                )


# -- installing a release on a CPU host --------------------------------------------------------
def cpu_requirements(metadata: str) -> list[str]:
    """Requires-Dist lines of a wheel's METADATA minus extras and CUDA-only packages."""
    reqs = []
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = line.split(":", 1)[1].strip()
        if "extra ==" in req:
            continue
        name = re.split(r"[\s\[<>=!~;]", req, maxsplit=1)[0]
        if CUDA_ONLY.match(name):
            continue
        reqs.append(req)
    return reqs


def _pip(python: str, *args: str) -> None:
    cmd = [python, "-m", "pip", "install", "-q", *args]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def install_cpu(python: str, version: str) -> None:
    torch = probe_torch(python)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [python, "-m", "pip", "download", "-q", "--no-deps", f"sglang=={version}", "-d", tmp],
            check=True,
        )
        wheel = next(Path(tmp).glob("sglang-*.whl"))
        with zipfile.ZipFile(wheel) as zf:
            meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
            reqs = cpu_requirements(zf.read(meta).decode())
        constraints = Path(tmp) / "constraints.txt"
        pins = "".join(f"{pin}\n" for pin in COMPAT_PINS.get(version, ()))
        constraints.write_text(f"torch=={torch}\n{pins}")
        requirements = Path(tmp) / "requirements.txt"
        requirements.write_text("\n".join(reqs) + "\n")
        _pip(python, "--no-deps", str(wheel))
        # torchvision: a CUDA build is all the index has; the plugin empties its one
        # CUDA-only submodule, and nothing else of it needs the CUDA library.
        _pip(python, "--no-deps", f"torchvision=={torchvision_for(torch)}")
        _pip(python, "-r", str(requirements), "-c", str(constraints))


def torchvision_for(torch: str) -> str:
    """The torchvision release built against `torch` (2.13.x -> 0.28.0)."""
    major, minor = (int(x) for x in torch.split("+")[0].split(".")[:2])
    return f"0.{minor + 15}.0" if major == 2 else "0.28.0"


def probe_torch(python: str) -> str:
    done = subprocess.run(
        [python, "-c", "import importlib.metadata as m; print(m.version('torch'))"],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise UsageError(f"{python} has no torch; install torch==2.13.0 (CPU build) first")
    return done.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hicache_diag.sglang.install")
    parser.add_argument("--python", default=sys.executable, help="interpreter to install into")
    parser.add_argument("--version", default=DEFAULT_VERSION, help="SGLang release")
    parser.add_argument("--force", action="store_true", help="reinstall even if present")
    args = parser.parse_args(argv)
    try:
        current = probe_sglang(args.python)
        if current.version == args.version and not args.force:
            print(f"sglang {current.version} already installed for {args.python}")
            return 0
    except UsageError:
        pass
    install_cpu(args.python, args.version)
    print(f"sglang {probe_sglang(args.python).version} installed for {args.python}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
