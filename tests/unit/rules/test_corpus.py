"""Every real-world corpus case (samples/corpus) keeps its pinned verdict, through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hicache_diag.cli.main import app

CORPUS = Path(__file__).resolve().parents[3] / "samples" / "corpus"
EXPECTED = json.loads((CORPUS / "expected.json").read_text())["cases"]
# Files of the corpus folder that are not cases.
NOT_CASES = ("README.md", "expected.json", "NEW-CASES-SCORE.md")


def triage(case: str) -> tuple[int, dict]:
    path = CORPUS / case
    argv = ["triage", "--json"]
    mode = EXPECTED[case].get("mode")
    if mode == "dumps":
        argv += ["--dumps", str(path)]
    elif mode == "logs+dumps":
        argv += ["--dumps", str(path / "dumps")]
        for f in sorted(path.glob("*.log")):
            argv += ["--logs", str(f)]
    else:
        for f in sorted(path.iterdir()) if path.is_dir() else [path]:
            argv += ["--logs", str(f)]
    result = CliRunner().invoke(app, argv)
    return result.exit_code, json.loads(result.stdout)


def test_the_corpus_has_at_least_70_cases_and_every_file_is_pinned():
    on_disk = {p.name for p in CORPUS.iterdir() if p.name not in NOT_CASES}
    assert on_disk == set(EXPECTED) and len(EXPECTED) >= 70


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_corpus_case(case):
    want = EXPECTED[case]
    exit_code, data = triage(case)
    culprit = data["culprit"]["label"] if data["culprit"] else None
    assert (data["kind"], data["form"], culprit) == (want["kind"], want["form"], want["culprit"])
    assert exit_code == want["exit"] == data["exit_code"]


def test_every_case_is_in_the_readme_table():
    readme = (CORPUS / "README.md").read_text()
    for case in EXPECTED:
        assert f"`{case}`" in readme, case
