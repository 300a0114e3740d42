"""Issue 41's hostile files, in triage's part: control characters a log carries (an OSC title
sequence, a bell, a C1 CSI) never reach the terminal raw; `--json` keeps the text (JSON escapes
it)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from hicache_diag.cli.main import app
from hicache_diag.cli.render.safe_text import safe, safe_report
from hicache_diag.triage.report import TriageReport


def test_control_characters_are_written_out_never_sent():
    assert safe("a\x1b]0;pwned\x07b\x9bc\td") == "a\\x1b]0;pwned\\x07b\\x9bc\td"
    report = TriageReport("unknown", evidence=["x\x1b[2Jy"], reason="r\x08", framing=["f\x00"])
    shown = safe_report(report)
    assert shown.evidence == ["x\\x1b[2Jy"] and shown.reason == "r\\x08"
    assert report.evidence == ["x\x1b[2Jy"]  # the report itself is left as it is


def test_a_log_with_escape_sequences_is_rendered_inert(tmp_path):
    log = tmp_path / "hostile.log"
    log.write_bytes(
        b"[2026-01-01 00:00:00 TP0] RuntimeError: boom \x1b]0;pwned\x07 \x1bP+q\x1b\\ \x7f\n"
    )
    text = CliRunner().invoke(app, ["triage", "--logs", str(log)]).output
    assert "\x1b]0" not in text and "\x07" not in text and "\x7f" not in text
    assert "boom" in text
    data = json.loads(CliRunner().invoke(app, ["triage", "--json", "--logs", str(log)]).stdout)
    assert data["kind"] == "crash"
