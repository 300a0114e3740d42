"""The two scans of an SGLang release's source: hook targets and CPU-only sgl_kernel imports."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from hicache_diag.engines.sglang.plugin.cpu_kernels import scan_cpu_kernel_names
from hicache_diag.engines.sglang.plugin.targets import TARGETS, scan_targets
from hicache_diag.options.release_order import release_key


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


def test_cpu_kernel_scan_keeps_only_imports_a_cpu_host_executes(tmp_path):
    _write(
        tmp_path,
        "a.py",
        """
        from sglang.srt.utils import is_cpu, is_cuda
        _is_cpu = is_cpu()
        _is_cuda = is_cuda()
        if _is_cpu:
            from sgl_kernel import assign_req_to_token_pool_cpu
        if _is_cuda:
            from sgl_kernel import silu_and_mul
        if not _is_cuda and _is_cpu:
            from sgl_kernel.mamba import causal_conv1d_fn_cpu
        try:
            from sgl_kernel import fused_add_rmsnorm
        except ImportError:
            pass
        def f():
            from sgl_kernel import inside_a_function
    """,
    )
    _write(tmp_path, "xpu_only.py", "from sgl_kernel import flash_mla_decode\n")
    assert scan_cpu_kernel_names(tmp_path) == {
        "sgl_kernel": ["assign_req_to_token_pool_cpu"],
        "sgl_kernel.mamba": ["causal_conv1d_fn_cpu"],
    }


def test_target_scan_names_what_is_missing_and_accepts_alternatives(tmp_path):
    assert len(scan_targets(tmp_path)) == len(TARGETS)  # an empty tree has none of them
    modules: dict[str, dict[str | None, list[str]]] = {}
    for target in TARGETS:
        module, qualname = target.options[-1]  # the last alternative is enough
        owner, _, name = qualname.rpartition(".")
        modules.setdefault(module, {}).setdefault(owner or None, []).append(name)
    for module, owners in modules.items():
        text = ""
        for owner, names in owners.items():
            defs = "".join(f"def {n}(self):\n    pass\n" for n in names)
            if owner:
                defs = f"class {owner}:\n" + textwrap.indent(defs, "    ")
            text += defs
        path = tmp_path / Path(*module.split(".")).with_suffix(".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert scan_targets(tmp_path) == []
    victim = tmp_path / "sglang" / "srt" / "managers" / "scheduler.py"
    victim.write_text("class Scheduler:\n    pass\n")
    missing = scan_targets(tmp_path)
    assert any("run_scheduler_process" in m for m in missing)
    assert any("Scheduler.get_next_batch_to_run" in m for m in missing)


@pytest.mark.process  # asks the interpreter where SGLang is, in a subprocess
def test_installed_sglang_has_every_target():
    """The release the README installs must satisfy the table (skips where none is installed)."""
    from hicache_diag.engines.sglang.release import probe_sglang
    from hicache_diag.errors import UsageError

    try:
        install = probe_sglang()
    except UsageError as exc:
        pytest.skip(str(exc))
    removed = {  # a target a later release removed by design is not missing there
        " or ".join(f"{m}.{q}" for m, q in t.options)
        for t in TARGETS
        if t.until and release_key(install.version) > release_key(t.until)
    }
    assert [m for m in scan_targets(install.site_root) if m not in removed] == []
    names = scan_cpu_kernel_names(install.package_dir)
    assert "assign_req_to_token_pool_cpu" in names.get("sgl_kernel", [])
