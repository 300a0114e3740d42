"""Which `sgl_kernel` names SGLang imports at module level on a CPU host (found by reading the
installed source, so each release gets its own list).

SGLang's CPU build ships these kernels in sgl_kernel; the pip wheel for CUDA cannot load here.
The stand-in (`shims.install_sgl_kernel`) must offer exactly these names and nothing else: other
modules probe `from sgl_kernel import x` inside try/except ImportError and must keep failing.
"""

from __future__ import annotations

import ast
from pathlib import Path

# On the CPU platform these are true; every other platform test is false.
_TRUE_ON_CPU = {"_is_cpu", "is_cpu"}


def _value(node: ast.expr) -> bool | None:
    """Evaluate a platform test as it comes out on a CPU host; None = cannot tell."""
    if isinstance(node, ast.Name):
        return node.id in _TRUE_ON_CPU
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.args:
        return node.func.id in _TRUE_ON_CPU
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        inner = _value(node.operand)
        return None if inner is None else not inner
    if isinstance(node, ast.BoolOp):
        values = [_value(v) for v in node.values]
        if None in values:
            return None
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.Attribute):  # e.g. TYPE_CHECKING spelled typing.TYPE_CHECKING
        return False
    return None


def _collect(body: list[ast.stmt], active: bool, gated: bool, out: dict[str, set[str]]) -> None:
    """`gated`: under a platform test that holds on CPU. Unconditional imports belong to files
    that only another platform loads (xpu_backend.py, tests) and are left out."""
    for node in body:
        if isinstance(node, ast.If):
            test = _value(node.test)
            _collect(node.body, active and test is True, True, out)
            _collect(node.orelse, active and test is False, gated, out)
        elif isinstance(node, ast.Try):
            continue  # guarded imports fall back on ImportError by design
        elif active and gated and isinstance(node, ast.ImportFrom) and node.module:
            if node.module.split(".")[0] == "sgl_kernel":
                out.setdefault(node.module, set()).update(a.name for a in node.names)


def scan_cpu_kernel_names(package_dir: Path) -> dict[str, list[str]]:
    """sgl_kernel module -> names imported unguarded at module level when running on CPU."""
    out: dict[str, set[str]] = {}
    for path in package_dir.rglob("*.py"):
        text = path.read_text(errors="replace")
        if "sgl_kernel" not in text:
            continue
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        _collect(tree.body, True, False, out)
    return {module: sorted(names) for module, names in sorted(out.items())}
