"""A release's interpreter sees only its own packages: the plugin ships as files (a bundle)
whose imports are the standard library, itself, and what SGLang itself imports; a release
missing a requirement is refused before launch, naming it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from hicache_diag.engines.sglang.bundle import module_closure, plugin_bundle
from hicache_diag.engines.sglang.release import SglangInstall, missing_requirements, preflight
from hicache_diag.errors import UsageError

# What the plugin may import besides the standard library and itself: SGLang and what SGLang
# requires (present in every release's environment).
RELEASE_PACKAGES = {"sglang", "torch", "transformers", "tokenizers", "torchvision", "tomli"}


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out


def test_the_bundle_imports_nothing_of_the_tools_environment():
    closure = module_closure()
    assert (
        "hicache_diag.engines.sglang.plugin.boot" in closure
        and "hicache_diag.faults.hooks" in closure
    )
    foreign = {
        name: sorted(
            _imports(path) - set(sys.stdlib_module_names) - RELEASE_PACKAGES - {"hicache_diag"}
        )
        for name, path in closure.items()
    }
    assert {k: v for k, v in foreign.items() if v} == {}


def test_the_bundle_is_rebuilt_when_empty_and_reused_after(tmp_path, monkeypatch):
    monkeypatch.setenv("HICACHE_DIAG_CACHE", str(tmp_path / "cache"))
    first = plugin_bundle()
    assert (first.site / "sitecustomize.py").is_file()
    assert (first.lib / "hicache_diag" / "engines" / "sglang" / "plugin" / "boot.py").is_file()
    assert (first.lib / "hicache_diag" / "faults" / "install.py").is_file()
    assert plugin_bundle() == first


@pytest.mark.process
def test_the_bundle_imports_with_no_site_packages_at_all(tmp_path, monkeypatch):
    """`python -S`: nothing installed is importable, so every plugin module must come from the
    bundle's files."""
    monkeypatch.setenv("HICACHE_DIAG_CACHE", str(tmp_path / "cache"))
    bundle = plugin_bundle()
    code = (
        "import hicache_diag.engines.sglang.plugin.boot, "
        "hicache_diag.engines.sglang.plugin.offline, "
        "hicache_diag.faults.install, hicache_diag.faults.hooks; print(hicache_diag.__file__)"
    )
    done = subprocess.run(
        [sys.executable, "-S", "-c", code],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": bundle.pythonpath(boot=False)},
        check=False,
        cwd=tmp_path,
    )  # not a checkout, whose hicache_diag/ would come first
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith(str(bundle.lib))


def _release(tmp_path: Path, **kw) -> SglangInstall:
    pkg = tmp_path / "site" / "sglang"
    pkg.mkdir(parents=True)
    return SglangInstall(python="/v/bin/python", version="0.5.99", package_dir=pkg, **kw)


def test_a_release_missing_a_requirement_is_refused_naming_it(tmp_path):
    install = _release(
        tmp_path,
        requires=(
            "aiohttp",
            "transformers==5.0",
            "av; extra == 'x'",
            'decord2; platform_machine == "armv7l"',
        ),
        installed=frozenset({"aiohttp"}),
    )
    assert missing_requirements(install) == ["transformers"]
    with pytest.raises(UsageError, match=r"lacks its requirement 'transformers'.*0\.5\.99"):
        preflight(install, cpu=True)


def test_what_the_installer_left_out_on_purpose_is_not_missing(tmp_path):
    install = _release(
        tmp_path,
        requires=("sglang-kernel==0.4", "aiohttp"),
        installed=frozenset({"aiohttp"}),
        record={"dropped": {"sglang-kernel": "CUDA-only: ..."}},
    )
    assert missing_requirements(install) == []


def test_an_offline_task_runs_one_thread_unless_told(monkeypatch, tmp_path):
    """The reference may run beside a warm server whose ranks hold the cores."""
    from hicache_diag.engines.sglang.bundle import PluginBundle, offline_env

    bundle = PluginBundle(root=tmp_path)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert offline_env(bundle)["OMP_NUM_THREADS"] == "1"
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    assert offline_env(bundle)["OMP_NUM_THREADS"] == "4"
