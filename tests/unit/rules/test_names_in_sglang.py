"""Checked against SGLang: every function name the rule book matches exists in SGLang 0.5.23, or
is marked as our runtime's (and exists there), a library's or a native frame's; every SGLang
frame in the sample dumps and logs names a function that holds that line in 0.5.23."""

from __future__ import annotations

import ast
import json
import re
from functools import cache
from pathlib import Path

import pytest

from hicache_diag.rules import signatures, wait_sites
from hicache_diag.rules.wait_sites import BUILTIN_NAMES, LIBRARY_NAMES, NATIVE_NAMES, table_names

from .sglang_source import VERSION, sglang_source

ROOT = Path(__file__).resolve().parents[3]


@cache
def _sglang() -> Path:
    root, why = sglang_source()
    if root is None:
        pytest.skip(f"no SGLang {VERSION} source: not importable and {why}")
    return root


_DEF = re.compile(r"^\s*(?:async\s+)?def\s+(\w+)\s*\(", re.M)


def _names(folder: Path) -> set[str]:
    """Every function name defined under `folder` (nested ones too), without leading `_`."""
    return {
        n.lstrip("_")
        for path in folder.rglob("*.py")
        for n in _DEF.findall(path.read_text(errors="replace"))
    }


@cache
def _spans(rel: str) -> dict[str, list[tuple[int, int]]]:
    """function name -> [(first line, last line)] in one SGLang file (`srt/...`, `kernels/...`)."""
    path = _sglang() / rel
    if not path.is_file():
        return {}
    funcs: dict[str, list[tuple[int, int]]] = {}
    for node in ast.walk(ast.parse(path.read_text(errors="replace"))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            funcs.setdefault(node.name, []).append((node.lineno, node.end_lineno or 0))
    return funcs


def test_every_rule_name_exists_in_sglang_or_is_marked():
    sglang = _names(_sglang())
    ours = _names(ROOT / "hicache_diag" / "engines" / "builtin" / "runtime")
    names = table_names() | signatures.BOOKKEEPING_FRAMES
    missing = sorted(
        n
        for n in names
        if n not in sglang and n not in BUILTIN_NAMES | LIBRARY_NAMES | NATIVE_NAMES
    )
    assert missing == [], f"not in SGLang {VERSION} and not marked: {missing}"
    # A builtin-runtime mark is a claim about our runtime: it must hold there, and not in SGLang
    # (a name SGLang has needs no mark).
    assert sorted(n for n in BUILTIN_NAMES if n not in ours) == []
    assert sorted(BUILTIN_NAMES & sglang) == []


def test_dropped_names_stay_dropped():
    """Names the old tables carried that SGLang never had (and our runtime lacks)."""
    gone = {
        "sync_and_clamp_prefetch_result",
        "bulk_check_prefetch_progress",
        "self_check_during_idle",
        "pp_sync_recv",
        "recv_outputs",
    }
    assert not gone & table_names()
    assert not gone & _names(_sglang())
    assert wait_sites.normalize("_pp_sync") == "pp_sync"


_SGL = r"(sglang/(?:srt|kernels)/[\w/]+\.py)"
_PYSPY_FRAME = re.compile(r"^\s+(\S+) \((.*?)(?::(\d+))?\)\s*$")
_TB_FRAME = re.compile(r'^\s+File "(.*?)", line (\d+), in (\S+)$')
# Calls that reach their callee through a variable, not by its name.
_DYNAMIC = {("forward", "sglang/kernels/fused_op.py")}
_WRAPPERS = {"wrapper", "decorate_context", "_call_impl", "_wrapped_call_impl"}


def _stacks():
    """(sample, frames innermost first as (name, path, line)) for every stack in the samples."""
    files = [p for p in (ROOT / "samples" / "dumps").rglob("*") if p.is_file()]
    files += list((ROOT / "samples" / "logs").glob("*.log"))
    for path in sorted(files):
        text = path.read_text(errors="replace")
        if path.suffix == ".json":
            doc = json.loads(text)
            threads = doc.get("threads") if isinstance(doc, dict) else doc
            for thread in threads if isinstance(threads, list) else []:
                frames = [
                    (str(f.get("name")), str(f.get("filename")), int(f.get("line") or 0))
                    for f in thread.get("frames") or []
                ]
                yield path.relative_to(ROOT), frames
            continue
        block: list[tuple[str, str, int]] = []
        tb: list[tuple[str, str, int]] = []
        for raw in text.splitlines() + [""]:
            if m := _TB_FRAME.match(raw):
                tb.append((m[3], m[1], int(m[2])))
                continue
            if raw.startswith("    ") and tb:
                continue  # the source line under a traceback frame
            if tb:
                yield path.relative_to(ROOT), tb[::-1]
                tb = []
            if m := _PYSPY_FRAME.match(raw):
                block.append((m[1], m[2], int(m[3] or 0)))
                continue
            if block:
                yield path.relative_to(ROOT), block
                block = []


def _innermost(spans: dict[str, list[tuple[int, int]]], line: int) -> str | None:
    """The innermost function whose body holds `line` (its frame is the one py-spy shows)."""
    holding = [(hi - lo, name) for name, ss in spans.items() for lo, hi in ss if lo <= line <= hi]
    return min(holding)[1] if holding else None


def _sglang_frames():
    for sample, frames in _stacks():
        for name, path, line in frames:
            if m := re.search(_SGL + "$", path):
                yield sample, name, m[1], line


def test_sample_stacks_are_stacks_sglang_can_produce():
    """The committed samples (not the corpus, which comes from other releases) show stacks
    SGLang 0.5.23 can produce: the line a frame names lies in that function's own body (not in
    a def nested in it), and a caller's line calls the next SGLang function by name."""
    bad = []
    seen = 0
    for sample, func, rel, line in _sglang_frames():
        seen += 1
        spans = _spans(rel.removeprefix("sglang/"))
        inner = _innermost(spans, line)
        if inner != func:  # a line of a nested def belongs to that def's own frame
            bad.append(f"{sample}: {func} ({rel}:{line}) is in {inner or 'no def'}")
    assert seen > 100
    assert bad == [], "\n".join(bad)


def test_sample_callers_call_their_callees():
    root = _sglang()
    bad = []
    for sample, frames in _stacks():
        for (callee, cpath, _), (caller, path, line) in zip(frames, frames[1:], strict=False):
            m = re.search(_SGL + "$", path)
            if not m or not re.search(_SGL + "$", cpath) or {caller, callee} & _WRAPPERS:
                continue
            if (caller, m[1]) in _DYNAMIC:
                continue
            text = (root.parent / m[1]).read_text(errors="replace").splitlines()
            code = text[line - 1] if 0 < line <= len(text) else ""
            if not re.search(rf"\b{re.escape(callee)}\b", code):
                bad.append(f"{sample}: {caller} ({m[1]}:{line}) does not call {callee}: {code!r}")
    assert bad == [], "\n".join(bad)
