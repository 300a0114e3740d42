"""--help reads well at 80 columns: one default style, no type placeholders, nothing cut off,
two or three examples per command, and bisect lists the run flags it passes through."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from hicache_diag.cli.main import app

COMMANDS = ["run", "record", "triage", "bisect", "report", "timeline", "sources", "export"]


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


def test_bare_command_prints_the_help_and_exits_0(capsys):
    from hicache_diag.cli.main import run_cli

    assert run_cli([]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("Usage: hicache-diag") and "timeline" in out
    assert "error" not in err


@pytest.mark.parametrize("argv", [["-h"], ["run", "-h"], ["triage", "-h"]])
def test_short_help_flag(capsys, argv):
    from hicache_diag.cli.main import run_cli

    assert run_cli(argv) == 0
    assert capsys.readouterr().out.startswith("Usage: hicache-diag")


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--pp", "0", "-v"],
        ["run", "-v", "--pp", "0"],
        ["-v", "run", "--pp", "0"],
        ["run", "--verbose", "--pp", "0"],
    ],
)
def test_verbose_anywhere(capsys, argv):
    from hicache_diag.cli.main import _hoist_verbose, run_cli

    assert _hoist_verbose(argv)[0] == "-v"
    assert run_cli(argv) == 2
    assert "--pp must be >= 1" in capsys.readouterr().err


def test_a_verbose_value_of_an_option_stays_a_value():
    from hicache_diag.cli.main import _hoist_verbose

    argv = ["run", "--engine", "sglang", "--sglang-arg", "-v"]
    assert _hoist_verbose(argv) == argv


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_help_lists_its_exit_codes(command):
    text = " ".join(_help(command).split())
    assert "Exit: 0" in text and "2 bad input" in text and "1 internal error" in text


def test_run_help_names_every_fault_and_switch_with_modes():
    from hicache_diag.engines.builtin.runtime.protocol import SWITCHES
    from hicache_diag.faults import FAULTS

    text = _help("run")
    for name in FAULTS:
        assert name in text.split("Faults (", 1)[1], name
    for sw in SWITCHES.values():
        assert f"{sw.name}={'|'.join(sw.modes)}" in text
    assert "4 --check mismatch" in " ".join(text.split())


def test_triage_usage_line_is_true():
    usage = _help("triage").splitlines()[0]
    assert usage == "Usage: hicache-diag triage [OPTIONS] [LOG]..."


@pytest.mark.process
def test_a_closed_stdout_keeps_the_exit_code(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    dumps = Path(__file__).resolve().parents[2] / "samples" / "dumps" / "pp_hang_pp_sync"
    argv = [sys.executable, "-m", "hicache_diag.cli.main", "triage", "--dumps", str(dumps)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the first line, as `| head -0` would be
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 12, err
    assert "BrokenPipe" not in err and "internal error" not in err


def test_docs_table_the_switches_and_modes_the_parser_accepts():
    from pathlib import Path

    from hicache_diag.engines.builtin.runtime.protocol import SWITCHES

    doc = (Path(__file__).resolve().parents[2] / "docs" / "faults.md").read_text()
    table = doc.split("## Protocol switches", 1)[1].split("\n## ", 1)[0]
    rows = {
        ln.split("|")[1].strip(" `"): ln.split("|")
        for ln in table.splitlines()
        if ln.startswith("| `")
    }
    assert set(rows) == set(SWITCHES)
    for sw in SWITCHES.values():
        assert rows[sw.name][2].strip(" `") == sw.legacy
        assert [m.strip(" `") for m in rows[sw.name][3].split(",")] == list(sw.fixed)
