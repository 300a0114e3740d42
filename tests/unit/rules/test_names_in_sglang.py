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


def _defs(folder: Path) -> dict[str, dict[str, list[tuple[int, int]]]]:
    """file (relative) -> function name -> [(first line, last line)] for every def, nested too."""
    out: dict[str, dict[str, list[tuple[int, int]]]] = {}
    for path in folder.rglob("*.py"):
        try:
            tree = ast.parse(path.read_text(errors="replace"))
        except (SyntaxError, ValueError):
            continue
        funcs: dict[str, list[tuple[int, int]]] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                funcs.setdefault(node.name, []).append((node.lineno, node.end_lineno or 0))
        out[str(path.relative_to(folder))] = funcs
    return out


@cache
def _sglang_defs() -> dict[str, dict[str, list[tuple[int, int]]]]:
    return _defs(_sglang())


def _names(defs: dict[str, dict[str, list[tuple[int, int]]]]) -> set[str]:
    return {n.lstrip("_") for funcs in defs.values() for n in funcs}


def test_every_rule_name_exists_in_sglang_or_is_marked():
    sglang = _names(_sglang_defs())
    ours = _names(_defs(ROOT / "hicache_diag" / "runtime"))
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
    gone = {"sync_and_clamp_prefetch_result", "bulk_check_prefetch_progress",
            "self_check_during_idle", "pp_sync_recv", "recv_outputs"}  # fmt: skip
    assert not gone & table_names()
    assert not gone & _names(_sglang_defs())
    assert wait_sites.normalize("_pp_sync") == "pp_sync"


_PYSPY_FRAME = re.compile(r"^\s+(\w+) \((?:.*?/)?(sglang/srt/[\w/]+\.py):(\d+)\)\s*$")
_TB_FRAME = re.compile(r'^\s+File ".*?/(sglang/srt/[\w/]+\.py)", line (\d+), in (\w+)$')


def _sample_frames():
    """(sample, function, file under sglang/, line) for every SGLang frame the samples show."""
    files = [p for p in (ROOT / "samples" / "dumps").rglob("*") if p.is_file()]
    files += list((ROOT / "samples" / "logs").glob("*.log"))
    for path in files:
        for raw in path.read_text(errors="replace").splitlines():
            if m := _PYSPY_FRAME.match(raw):
                yield path.relative_to(ROOT), m[1], m[2], int(m[3])
            elif m := _TB_FRAME.match(raw):
                yield path.relative_to(ROOT), m[3], m[1], int(m[2])
    for path in (ROOT / "samples" / "dumps").rglob("*.json"):
        for frame in _json_frames(json.loads(path.read_text())):
            name, filename = str(frame.get("name", "")), str(frame.get("filename", ""))
            if m := re.search(r"(sglang/srt/[\w/]+\.py)$", filename):
                yield path.relative_to(ROOT), name, m[1], int(frame.get("line") or 0)


def _json_frames(doc):
    threads = doc.get("threads", []) if isinstance(doc, dict) else doc
    for thread in threads if isinstance(threads, list) else []:
        yield from thread.get("frames") or []


def test_sample_stacks_are_stacks_sglang_can_produce():
    """The committed samples (not the corpus, which comes from other releases) show SGLang
    0.5.23 frames: each function exists in the file the frame names. (Line numbers are not
    checked: the samples' lines were written by hand and most do not match 0.5.23.)"""
    defs = _sglang_defs()
    bad = []
    seen = 0
    for sample, func, rel, _line in _sample_frames():
        seen += 1
        funcs = defs.get(rel.removeprefix("sglang/"), {})
        if func not in funcs:
            bad.append(f"{sample}: {func} not defined in {rel}")
    assert seen > 20
    assert bad == [], "\n".join(bad)
