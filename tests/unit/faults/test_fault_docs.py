"""docs/faults.md documents every registered fault and every one of its keys."""

from pathlib import Path

import pytest

from hicache_diag.faults import FAULTS, parse_fault_spec

DOC = Path(__file__).resolve().parents[3] / "docs" / "faults.md"


@pytest.mark.parametrize("name", list(FAULTS))
def test_every_fault_and_key_is_documented(name):
    text = DOC.read_text()
    assert f"| `{name}` |" in text, f"{name} missing from the table in {DOC}"
    for key in FAULTS[name].key_names():
        assert f"`{key}" in text, f"key {key!r} of {name} undocumented"


def test_every_example_in_the_doc_parses():
    examples = [
        line.split("'")[1] for line in DOC.read_text().splitlines() if line.startswith("--fault '")
    ]
    assert len(examples) >= len(FAULTS)
    assert {parse_fault_spec(e).name for e in examples} == set(FAULTS)
