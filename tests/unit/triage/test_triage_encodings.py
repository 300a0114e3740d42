"""Encodings: a log saved by PowerShell's `>` (UTF-16LE with a BOM, CRLF), with a UTF-8 BOM,
as UTF-16 without a BOM, or gzip'd in any of them reads as the original; a cut gzip is read up
to the cut and says so; a file that is no text is refused in one line naming what it looks
like (tests/cli/test_triage.py checks the exit code)."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest

from hicache_diag.errors import UsageError
from hicache_diag.logs.files import NotALog, decode_text, sniff_encoding
from hicache_diag.triage.session import TriageRequest, run_triage
from tests.unit.triage.deliveries import verdict

ROOT = Path(__file__).resolve().parents[3]
SAMPLE_LOGS = sorted((ROOT / "samples" / "logs").glob("*.log"))


def _triage(*logs: Path):
    return run_triage(TriageRequest(logs=logs))


def _powershell(text: str) -> bytes:
    """What `Get-Content x | Out-File` / `>` writes on Windows PowerShell 5: UTF-16LE, BOM, CRLF."""
    return text.replace("\n", "\r\n").encode("utf-16")


ENCODINGS = {
    "utf-16-powershell": _powershell,
    "utf-16-le-no-bom": lambda t: t.encode("utf-16-le"),
    "utf-16-be-no-bom": lambda t: t.encode("utf-16-be"),
    "utf-8-bom": lambda t: t.encode("utf-8-sig"),
    "utf-16-gzip": lambda t: gzip.compress(_powershell(t)),
}


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("log", SAMPLE_LOGS, ids=lambda p: p.name)
def test_a_re_encoded_sample_log_keeps_its_verdict(log, encoding, tmp_path):
    assert SAMPLE_LOGS, "samples/logs holds no log"
    copy = tmp_path / log.name
    copy.write_bytes(ENCODINGS[encoding](log.read_text()))
    original, again = _triage(log), _triage(copy)
    assert verdict(again) == verdict(original)
    assert again.signature == original.signature


def test_the_bom_never_reaches_the_first_line(tmp_path):
    log = tmp_path / "bom.log"
    log.write_bytes(_powershell("[2026-01-01 00:00:00 PP1 TP0] Decode batch, #running-req: 1\n"))
    report = _triage(log)
    assert report.kind == "busy" and [r.rank.label for r in report.ranks] == ["PP1 TP0"]


def test_a_cut_gzip_is_read_up_to_the_cut_and_says_so(tmp_path):
    text = (ROOT / "samples" / "logs" / "healthy_busy.log").read_text()
    full = gzip.compress(text.encode())
    cut = tmp_path / "server.log.gz"
    cut.write_bytes(full[: len(full) * 2 // 3])
    report = _triage(cut)
    assert any("gzip stream is cut short" in e for e in report.evidence)
    whole = tmp_path / "whole.log.gz"
    whole.write_bytes(full)
    assert not any("cut short" in e for e in _triage(whole).evidence)


BINARIES = {
    "an ELF binary": b"\x7fELF\x02\x01\x01" + bytes(200),
    "a PNG image": b"\x89PNG\r\n\x1a\n" + bytes(range(256)),
    "a zip archive": b"PK\x03\x04" + bytes(100),
    "binary data": bytes(range(256)) * 4,
}


@pytest.mark.parametrize("what", BINARIES)
def test_a_binary_file_is_refused_naming_what_it_looks_like(what, tmp_path):
    with pytest.raises(NotALog, match=what):
        sniff_encoding(BINARIES[what])
    path = tmp_path / "server.log"
    path.write_bytes(BINARIES[what])
    with pytest.raises(UsageError, match=f"--logs .*server.log: not a log: {what}"):
        _triage(path)


def test_a_binary_inside_gzip_is_refused_too(tmp_path):
    path = tmp_path / "server.log.gz"
    path.write_bytes(gzip.compress(BINARIES["an ELF binary"]))
    with pytest.raises(UsageError, match="an ELF binary"):
        _triage(path)


def test_text_with_colours_and_tabs_is_text():
    assert sniff_encoding(b"\x1b[32m[2026-01-01 00:00:00]\x1b[0m\tok\r\n\x0c") == "utf-8"
    assert decode_text("é ok".encode("utf-16")) == "é ok"


def test_a_utf16_stack_dump_in_a_dumps_folder_is_read(tmp_path):
    src = ROOT / "samples" / "dumps" / "pp_hang_pp_sync"
    want = verdict(run_triage(TriageRequest(dumps=(src,))))
    copy = tmp_path / "dumps"
    shutil.copytree(src, copy)
    for f in copy.rglob("*"):
        if f.is_file():
            f.write_bytes(_powershell(f.read_text()))
    assert verdict(run_triage(TriageRequest(dumps=(copy,)))) == want
