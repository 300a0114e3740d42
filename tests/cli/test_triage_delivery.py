"""`hicache-diag triage` on logs as they arrive: gzip'd, bad gzip, the --pp hint, the
confidence in --json, the progress line (a terminal only)."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

from rich.console import Console
from typer.testing import CliRunner

from hicache_diag.cli.main import app, run_cli
from hicache_diag.cli.render.log_progress import LogReadProgress

LOGS = Path(__file__).resolve().parents[2] / "samples" / "logs"
runner = CliRunner()


def test_a_gzipd_log_gives_the_plain_logs_verdict(tmp_path):
    plain = LOGS / "form_a_cascade.log"
    gz = tmp_path / "form_a_cascade.log.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    a = runner.invoke(app, ["triage", "--json", "--logs", str(plain)])
    b = runner.invoke(app, ["triage", "--json", "--logs", str(gz)])
    assert a.exit_code == b.exit_code == 10
    assert json.loads(a.stdout)["kind"] == json.loads(b.stdout)["kind"] == "crash"


def one_line_error(argv: list[str], capsys) -> str:
    code = run_cli(["triage", *argv])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    return err


def test_a_bad_gzip_is_one_line_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "server.log.gz"
    bad.write_bytes(b"\x1f\x8b\x08\x00garbage" * 5)
    assert "cannot read" in one_line_error(["--logs", str(bad)], capsys)


SHAPE = (
    "[2026-01-01 00:00:00 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
    '  File "/s/rotary_embedding.py", line 9, in forward_native\n'
    "RuntimeError: shape '[65, -1, 64]' is invalid for input of size 827392\n"
)


def test_pp_size_hint_and_confidence_in_json(tmp_path, capsys):
    log = tmp_path / "s.log"
    log.write_text(SHAPE)
    plain = runner.invoke(app, ["triage", "--json", "--logs", str(log)])
    hinted = runner.invoke(app, ["triage", "--json", "--pp", "2", "--logs", str(log)])
    assert (plain.exit_code, hinted.exit_code) == (16, 10)
    assert json.loads(plain.stdout)["confidence"] == "medium"
    assert json.loads(hinted.stdout)["form"] == "A"
    assert "--pp must be positive" in one_line_error(["--pp", "0", "--logs", str(log)], capsys)


def test_the_old_pp_size_spelling_still_works_and_says_so(tmp_path, capsys):
    from hicache_diag.cli.main import run_cli

    log = tmp_path / "s.log"
    log.write_text(SHAPE)
    assert run_cli(["triage", "--json", "--pp-size", "2", "--logs", str(log)]) == 10
    out, err = capsys.readouterr()
    assert json.loads(out)["form"] == "A"
    assert err.strip() == "hicache-diag: warning: --pp-size is deprecated: use --pp"


def test_the_progress_line_shows_on_a_terminal_only_after_a_while():
    out = io.StringIO()
    with LogReadProgress(Console(file=out, force_terminal=False)) as p:
        p(10, 100)
    assert out.getvalue() == ""
    term = io.StringIO()
    with LogReadProgress(Console(file=term, force_terminal=True), show_after_s=0) as p:
        p(50, 100)
    assert "reading logs" in term.getvalue()
    quick = io.StringIO()
    with LogReadProgress(Console(file=quick, force_terminal=True), show_after_s=60) as p:
        p(50, 100)  # a read shorter than a minute: nothing drawn
    assert quick.getvalue() == ""
