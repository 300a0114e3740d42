"""`sources` on SGLang 0.5.23 against the hand-checked list of its per-rank reads
(tests/data/sources_truth_0.5.23.toml; bench/sources_recall.py prints the same scores).

The 0.5.23 source: test_real_releases.py's places (`$HICACHE_DIAG_SGLANG_RELEASES/0.5.23`, the
cache, `$HICACHE_DIAG_SGLANG_SRC`), else tests/unit/rules/sglang_source.py's (an importable
sglang, or `pip download` into the cache, as the rules fidelity tests do). Skipped when none is
0.5.23."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

from hicache_diag.sources.locate import source_tree
from hicache_diag.sources.scan import scan_tree
from tests.unit.rules.sglang_source import sglang_source
from tests.unit.sources.test_real_releases import _candidates
from tests.unit.sources.truth import load_truth, score

TRUTH = Path(__file__).resolve().parents[2] / "data" / "sources_truth_0.5.23.toml"


@cache
def _inventory():
    found = [p for p in _candidates("0.5.23") if (p / "srt").is_dir() or (p / "sglang").is_dir()]
    if not found:
        root, why = sglang_source()
        if root is None:
            pytest.skip(f"no sglang 0.5.23 source: {why}")
        found = [root]
    tree = source_tree(found[0])
    if tree.version != "0.5.23":
        pytest.skip(f"the sglang found is {tree.version}, not 0.5.23")
    return scan_tree(tree)


def test_the_truth_list_parses_and_each_entry_says_how_it_was_checked():
    truth = load_truth(TRUTH)
    assert truth.version == "0.5.23" and len(truth.reads) >= 20 and truth.logical
    text = TRUTH.read_text()
    assert text.count("checked = ") == len(truth.reads) + len(truth.logical)


def test_every_listed_read_is_found_with_its_alignment_and_modes():
    s = score(_inventory(), load_truth(TRUTH))
    assert not s.missed, [t.where for t in s.missed]
    assert not s.wrong, [(t.where, why) for t, why in s.wrong]
    assert s.recall == 1.0
    assert len(s.decided) == s.total, [t.where for t in s.aligned if t not in s.decided]


def test_no_logical_state_is_listed_as_a_physical_source():
    s = score(_inventory(), load_truth(TRUTH))
    assert s.logical_as_source == [] and s.logical_missing == []
    assert s.precision == 1.0
    assert not [x for x in _inventory().sources if x.kind == "logical-state"]
