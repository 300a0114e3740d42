"""The plugin as plain files on a launch's PYTHONPATH, so a release's interpreter never sees
the tool's own environment (a `--sglang-python` venv imports only its own packages).

The bundle holds `site/sitecustomize.py` (the plugin's entry in every process of the launch)
and `lib/hicache_diag/...`: the plugin package and the few modules it imports, found by
following its imports (standard library only besides what SGLang itself imports; a test holds
that). It is keyed by the content of those files and built once into the tool's cache.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from hicache_diag.engines.sglang.cache import build_once, cache_root

# Where the plugin starts: its entry, what boot imports lazily, and the offline tasks.
ROOTS = (
    "hicache_diag.engines.sglang.plugin.start",
    "hicache_diag.engines.sglang.plugin.boot",
    "hicache_diag.engines.sglang.plugin.shims",
    "hicache_diag.engines.sglang.plugin.offline",
    "hicache_diag.faults.install",
    "hicache_diag.faults.hooks",
)
_SITE = Path(__file__).resolve().parent / "plugin" / "site" / "sitecustomize.py"


@dataclass(frozen=True, slots=True)
class PluginBundle:
    root: Path

    @property
    def site(self) -> Path:
        return self.root / "site"

    @property
    def lib(self) -> Path:
        return self.root / "lib"

    def pythonpath(self, *, boot: bool) -> str:
        """The launch's PYTHONPATH: with `boot`, sitecustomize loads the plugin in every
        process; without, only the library (offline tasks)."""
        return os.pathsep.join([str(self.site), str(self.lib)] if boot else [str(self.lib)])


def module_closure(roots: tuple[str, ...] = ROOTS) -> dict[str, Path]:
    """Module name -> source file, for `roots`, their packages and every `hicache_diag` module
    they import (at any depth, lazy imports included)."""
    found: dict[str, Path] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in found:
            continue
        try:
            spec = importlib.util.find_spec(name)
        except ModuleNotFoundError:  # `from module import name`: name is not a module
            continue
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            continue  # `from pkg import name` where name is not a module
        found[name] = Path(spec.origin)
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        for node in ast.walk(ast.parse(found[name].read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if node.module.split(".")[0] == "hicache_diag":
                    todo.append(node.module)
                    todo += [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                todo += [a.name for a in node.names if a.name.split(".")[0] == "hicache_diag"]
    return found


def _relpath(name: str, origin: Path) -> Path:
    parts = name.split(".")
    if origin.name == "__init__.py":
        return Path(*parts, "__init__.py")
    return Path(*parts[:-1], f"{parts[-1]}.py")


def plugin_bundle() -> PluginBundle:
    files = {_relpath(n, p): p for n, p in module_closure().items()}
    digest = hashlib.sha256()
    for rel, src in sorted(files.items()) + [(Path("sitecustomize.py"), _SITE)]:
        digest.update(str(rel).encode() + b"\0" + src.read_bytes() + b"\0")

    def build(out: Path) -> None:
        for rel, src in files.items():
            (out / "lib" / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, out / "lib" / rel)
        (out / "site").mkdir()
        shutil.copyfile(_SITE, out / "site" / "sitecustomize.py")

    target = cache_root() / "plugin" / digest.hexdigest()[:16]
    return PluginBundle(build_once(target, build, marker="site/sitecustomize.py"))


def offline_env(bundle: PluginBundle) -> dict[str, str]:
    """The environment of an offline task in the release's python: the bundle's library only,
    nothing of the caller's PYTHONPATH (it may name the tool's own site)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PYTHONPATH"] = bundle.pythonpath(boot=False)
    env["PYTHONNOUSERSITE"] = "1"
    # One thread: the tiny model's 64-wide layers gain nothing from more, and the task may run
    # beside a warm server whose ranks hold the cores (torch's thread per core then spins
    # against them: the reference of 48 prompts took minutes that way).
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def offline_launch(python: str, *args: str) -> dict:
    """The args, env and cwd of `python -m hicache_diag.engines.sglang.plugin.offline ARGS` in the
    release's interpreter: one home for a one-shot task and a kept worker alike."""
    bundle = plugin_bundle()
    argv = [python, "-m", "hicache_diag.engines.sglang.plugin.offline", *args]
    return {"args": argv, "env": offline_env(bundle), "cwd": bundle.root}


def run_offline(python: str, *args: str, timeout_s: float = 600) -> subprocess.CompletedProcess:
    """`python -m hicache_diag.engines.sglang.plugin.offline ARGS` in the release's interpreter."""
    return subprocess.run(
        **offline_launch(python, *args),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
