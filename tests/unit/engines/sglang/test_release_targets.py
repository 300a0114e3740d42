"""Older SGLang layouts: a release lacking a hook point refuses only the faults on that point,
probe/shim targets have per-release alternatives, and the 0.5.1x kernel stub gets replaced."""

import textwrap
from pathlib import Path

import pytest

from hicache_diag.engines.sglang.plugin import shims
from hicache_diag.engines.sglang.plugin.targets import TARGETS, missing_points, scan_targets
from hicache_diag.engines.sglang.release import SglangInstall, refuse_unhookable
from hicache_diag.errors import UsageError


def _fake_release(root: Path, *, with_clock: bool, old_layout: bool) -> Path:
    """Write every target's module with the def it needs, in the old or the new layout."""
    defs: dict[str, dict[str, list[str]]] = {}  # module -> class ("" = module level) -> names
    for target in TARGETS:
        if target.key == "time_counter" and not with_clock:
            continue
        pick = target.options[-1] if old_layout and len(target.options) > 1 else target.options[0]
        module, qualname = pick
        owner, _, name = qualname.rpartition(".")
        defs.setdefault(module, {}).setdefault(owner, []).append(name)
    for module, owners in defs.items():
        lines = []
        for owner, names in owners.items():
            if owner:
                lines += [f"class {owner}:"] + [f"    def {n}(self): pass" for n in names]
            else:
                lines += [
                    f"class {n}: pass" if n[0].isupper() else f"def {n}(): pass" for n in names
                ]
        path = root.joinpath(*module.split(".")).with_suffix(".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n")
    return root


def test_old_layout_satisfies_every_required_target(tmp_path):
    root = _fake_release(tmp_path, with_clock=False, old_layout=True)
    assert scan_targets(root, roles="required") == []
    assert set(missing_points(root)) == {"now"}
    assert scan_targets(root) == [
        "sglang.srt.mem_cache.unified_cache.components.base.get_and_increase_time_counter"
    ]


def test_full_release_has_every_point(tmp_path):
    root = _fake_release(tmp_path, with_clock=True, old_layout=False)
    assert scan_targets(root) == [] and missing_points(root) == {}


def test_only_the_fault_on_a_missing_point_is_refused():
    install = SglangInstall("py", "0.5.12.post1", Path("/x"), missing_points={"now": "lacks it"})
    refuse_unhookable(install, ("dma-delay:rank=1,ms=5", "host-alloc-fail:rank=1"))
    with pytest.raises(UsageError) as err:
        refuse_unhookable(install, ("dma-delay:rank=1,ms=5", "clock-skew:jitter-us=5"))
    assert str(err.value) == (
        "fault 'clock-skew' cannot run on sglang 0.5.12.post1 (hook point 'now'): lacks it"
    )


def test_transfer_kv_direct_replaces_the_raising_stub_but_not_a_real_kernel():
    class Mod:
        pass

    old = Mod()
    old.transfer_kv_direct = shims._unavailable("sgl_kernel.kvcacheio", "transfer_kv_direct")
    shims._add_transfer_kv_direct(old)
    assert old.transfer_kv_direct is shims.transfer_kv_direct
    new = Mod()
    shims._add_transfer_kv_direct(new)
    assert new.transfer_kv_direct is shims.transfer_kv_direct
    real = Mod()
    real.transfer_kv_direct = print
    shims._add_transfer_kv_direct(real)
    assert real.transfer_kv_direct is print


def _src(root, rel: str, text: str) -> None:
    path = root / "srt" / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


def test_omp_bind_entries_follow_the_releases_own_signature(tmp_path):
    """init_threads_binding(numa_index, world_size) (0.5.2x) wants an entry per rank of the
    world; (tp_rank, tp_size) (0.5.18), or none at all (0.5.12-0.5.14's inline ModelRunner
    code), one per TP rank."""
    from hicache_diag.engines.sglang.launch_facts import read_launch_facts

    assert read_launch_facts(tmp_path).omp_bind_entries(2, 2) == 2
    _src(
        tmp_path,
        "utils/numa_utils.py",
        """
        def init_threads_binding(*, tp_rank, tp_size):
            omp = os.environ.get("SGLANG_CPU_OMP_THREADS_BIND", "all")
    """,
    )
    assert read_launch_facts(tmp_path).omp_bind == "tp"
    _src(
        tmp_path,
        "utils/numa_utils.py",
        """
        def init_threads_binding(*, numa_index, world_size):
            pass
    """,
    )
    facts = read_launch_facts(tmp_path)
    assert facts.omp_bind == "world" and facts.omp_bind_entries(2, 2) == 4


def test_pages_over_one_need_triton_only_where_the_kernel_has_no_other_path(tmp_path):
    from hicache_diag.engines.sglang.launch_facts import read_launch_facts

    body = """
        class PagedTokenToKVPoolAllocator(Base):
            def alloc_extend(self, prefix_lens, seq_lens):
                out = torch.empty(3)
                {launch}
                return out
    """
    _src(
        tmp_path,
        "mem_cache/allocator/paged.py",
        body.format(launch="alloc_extend_kernel[(bs,)](prefix_lens, out)"),
    )
    assert read_launch_facts(tmp_path).paged_alloc_needs_triton
    guarded = (
        "if self.use_triton_kernels:\n                    alloc_extend_kernel[(bs,)](out)"
        "\n                else:\n                    alloc_extend_naive(out)"
    )
    _src(tmp_path, "mem_cache/allocator/paged.py", body.format(launch=guarded))
    assert not read_launch_facts(tmp_path).paged_alloc_needs_triton


def test_free_port_leaves_sglangs_grpc_headroom():
    from hicache_diag.engines.sglang.ports import MAX_PORT, free_port

    assert all(free_port() <= MAX_PORT for _ in range(20))
