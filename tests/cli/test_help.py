"""--help reads well at 80 columns: one default style, no type placeholders, nothing cut off,
two or three examples per command, and bisect lists the run flags it passes through."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from hicache_diag.cli.main import app

COMMANDS = ["run", "triage", "bisect", "report", "timeline", "sources"]


def _help(*args: str) -> str:
    res = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    return res.output


@pytest.mark.parametrize("command", COMMANDS)
def test_help_reads_well_at_80_columns(command):
    text = _help(command)
    long = [ln for ln in text.splitlines() if len(ln) > 80]
    assert not long, long
    assert "…" not in text, "a flag or help text was cut off"
    flags = [re.sub(r"\[default: [^\]]*\]", "", ln) for ln in text.splitlines()]
    flags = [ln for ln in flags if ln.lstrip().startswith("-")]
    assert not [ln for ln in flags if re.search(r"<\w+(\[\w+\])?>", ln)], "type placeholder"
    assert " ." not in text, "a swallowed default left a stray ' .'"
    assert not re.search(r"\[\d[\d.]*\]", text), "old '[2]' default style"
    assert "(default:" not in text
    examples = text.split("Examples:", 1)[1].split("\n\n", 1)[0]
    n = sum(1 for ln in examples.splitlines() if ln.strip().startswith("hicache-diag "))
    assert 2 <= n <= 3, examples


def test_run_help_shows_every_default_one_way():
    text = _help("run")
    for flag, default in (("--pp", "2"), ("--max-total-tokens", "256"), ("--protocol", "full")):
        block = text.split(flag + " ", 1)[1].split("\n  --", 1)[0]
        assert f"[default: {default}]" in " ".join(block.split()), block


def test_bisect_help_lists_the_run_flags_it_passes_through():
    text = " ".join(_help("bisect").split())
    assert "Run flags passed to every trial" in text
    for flag in ("--fault", "--protocol", "--max-total-tokens", "--hang-timeout", "--scenario"):
        assert flag in text.split("Run flags passed to every trial", 1)[1]
