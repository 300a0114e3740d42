"""No input makes triage itself fail (exit 1): shuffled, cut and mixed real lines, binary junk."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from hicache_diag.cli.main import app, run_cli
from hicache_diag.evidence.stacks import parse_dump_text
from hicache_diag.logs.parse import parse_log_lines
from hicache_diag.triage.classify import classify

SAMPLES = Path(__file__).resolve().parents[3] / "samples"
LINES = sorted(
    {
        line
        for path in list(SAMPLES.rglob("*.log")) + list(SAMPLES.rglob("*.txt"))
        for line in path.read_text(errors="replace").splitlines()
    }
)
line = st.one_of(st.sampled_from(LINES), st.text(max_size=80))
cut = st.tuples(line, st.integers(0, 120)).map(lambda lc: lc[0][: lc[1]])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(line, cut), max_size=60))
def test_any_mix_of_real_lines_classifies(lines):
    report = classify([], parse_log_lines(lines, "fuzz.log"))
    assert report.kind in ("crash", "hang", "healthy", "busy", "unknown")
    assert int(report.exit_code) in (0, 3, 10, 11, 12, 16)
    parse_dump_text("\n".join(lines), "fuzz.txt")


def test_binary_files_are_refused_and_empty_ones_undecided_never_internal_errors(tmp_path, capsys):
    # Issue 29: a binary file is refused in one line naming what it looks like (exit 2), no
    # longer read as a log that says nothing (exit 3).
    junk = tmp_path / "core.bin"
    junk.write_bytes(bytes(range(256)) * 64)
    assert run_cli(["triage", "--json", "--logs", str(junk)]) == 2
    err = capsys.readouterr().err.strip()
    assert "not a log: binary data" in err and len(err.splitlines()) == 1
    empty = tmp_path / "empty.log"
    empty.write_text("")
    result = CliRunner().invoke(app, ["triage", "--json", "--logs", str(empty)])
    assert result.exit_code == 3, result.output
