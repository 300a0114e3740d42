"""docs/evidence.md and the layout module (hicache_diag/evidence.py) name the same files."""

from __future__ import annotations

import re
from pathlib import Path

from hicache_diag import evidence as ev

DOC = (Path(__file__).resolve().parents[2] / "docs" / "evidence.md").read_text()


def _tree() -> set[str]:
    """The file names of the doc's run-directory tree (`├── manifest.json   written first`)."""
    block = DOC.split("```", 2)[1]
    return {m for m in re.findall(r"[├└]── (\S+)", block) if not m.endswith("/")}


def test_the_docs_tree_is_the_layout():
    assert _tree() == set(ev.LAYOUT)


def test_every_sglang_engine_file_is_documented():
    for name in ev.SGLANG_LAYOUT:
        assert f"`{name}`" in DOC, name


def test_paths_are_built_from_the_layout(tmp_path):
    assert ev.rank_jsonl(tmp_path, 3).name == "rank3.jsonl"
    assert ev.stack_json(tmp_path, 1).relative_to(tmp_path).as_posix() == "stacks/rank1.json"
    assert ev.stack_txt(tmp_path, 1).relative_to(tmp_path).as_posix() == "stacks/rank1.txt"
