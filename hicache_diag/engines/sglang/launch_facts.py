"""What a launch on this host must know about a release, read from its installed source (ast),
never guessed from its version number. The facts go into manifest.json.

- `omp_bind`: how `SGLANG_CPU_OMP_THREADS_BIND` is indexed. `init_threads_binding(numa_index,
  world_size)` (0.5.2x, utils/numa_utils.py) wants one entry per rank of the whole world;
  `init_threads_binding(tp_rank, tp_size)` (0.5.18) and the inline code in ModelRunner
  (0.5.12-0.5.14) want one per TP rank, and assert the count.
- `paged_alloc_needs_triton`: `PagedTokenToKVPoolAllocator.alloc_extend` launches its triton
  kernel with no other path (before `use_triton_kernels` appeared), so pages of more than one
  token need a GPU driver: on CPU such a release runs with page size 1.
"""

from __future__ import annotations

import ast
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class LaunchFacts:
    omp_bind: str = "world"  # "world": dp*tp*pp entries | "tp": tp_size entries
    paged_alloc_needs_triton: bool = False

    def omp_bind_entries(self, pp_size: int, tp_size: int) -> int:
        return pp_size * tp_size if self.omp_bind == "world" else tp_size

    def to_json(self) -> dict:
        return asdict(self)


def _functions(path: Path, name: str) -> list[ast.FunctionDef]:
    try:
        tree = ast.parse(path.read_text(errors="replace"))
    except (OSError, SyntaxError):
        return []
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name]


def _omp_bind(srt: Path) -> str:
    for path in (
        srt / "utils" / "numa_utils.py",
        srt / "utils" / "common.py",
        srt / "model_executor" / "model_runner.py",
    ):
        for fn in _functions(path, "init_threads_binding"):
            args = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
            if "world_size" in args:
                return "world"
            if "tp_size" in args:
                return "tp"
    return "tp"  # the inline ModelRunner code of 0.5.12-0.5.14: one entry per TP rank


def _unguarded_kernel_launch(fn: ast.FunctionDef, kernel: str) -> bool:
    """Whether `fn` launches `kernel[grid](...)` outside any `if` (no other path)."""

    def walk(nodes: list[ast.stmt], guarded: bool) -> bool:
        for node in nodes:
            if isinstance(node, ast.If):
                if walk(node.body, True) or walk(node.orelse, True):
                    return True
                continue
            for sub in ast.walk(node):
                if (
                    isinstance(sub, ast.Call)
                    and isinstance(sub.func, ast.Subscript)
                    and isinstance(sub.func.value, ast.Name)
                    and sub.func.value.id == kernel
                    and not guarded
                ):
                    return True
        return False

    return walk(fn.body, False)


def _paged_alloc_needs_triton(srt: Path) -> bool:
    for path in sorted((srt / "mem_cache").rglob("*.py")):
        text = path.read_text(errors="replace")
        if "class PagedTokenToKVPoolAllocator" not in text:
            continue
        tree = ast.parse(text)
        for cls in ast.walk(tree):
            if isinstance(cls, ast.ClassDef) and cls.name == "PagedTokenToKVPoolAllocator":
                for fn in cls.body:
                    if isinstance(fn, ast.FunctionDef) and fn.name == "alloc_extend":
                        return _unguarded_kernel_launch(fn, "alloc_extend_kernel")
    return False


def read_launch_facts(package_dir: Path) -> LaunchFacts:
    srt = package_dir / "srt"
    return LaunchFacts(
        omp_bind=_omp_bind(srt), paged_alloc_needs_triton=_paged_alloc_needs_triton(srt)
    )
