"""`run --list-faults` and docs/faults.md say the same of every fault (faults/catalog.py)."""

from pathlib import Path

import pytest

from hicache_diag.faults import FAULTS
from hicache_diag.faults.catalog import catalog_markdown, catalog_text

DOC = Path(__file__).resolve().parents[3] / "docs" / "faults.md"
START = "<!-- catalog:start (faults/catalog.py; run --list-faults) -->"


def test_the_docs_section_is_the_catalog():
    text = DOC.read_text()
    section = text[text.index(START) + len(START) + 1 : text.index("<!-- catalog:end -->")]
    assert section == catalog_markdown()


@pytest.mark.parametrize("name", list(FAULTS))
def test_every_fault_states_its_event_production_place_and_limits(name):
    cls = FAULTS[name]
    assert cls.EVENT and cls.WHEN and cls.CANNOT, name
    assert cls.ACTS_IN and all(r and w for r, w in cls.ACTS_IN), name
    assert f"{name}  (keys:" in catalog_text()


def test_the_faults_that_make_unreachable_states_say_so():
    flagged = {n for n, c in FAULTS.items() if c.UNREACHABLE}
    assert {"host-alloc-fail", "clock-skew"} <= flagged
    assert "host-shortage" not in flagged and "dma-delay" not in flagged
    assert "NO, it can make a state SGLang cannot reach" in catalog_text()
