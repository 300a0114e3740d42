"""Logs stream through triage: the fast path agrees with the full one, memory stays bounded
however long the log, gzip'd logs are read directly."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from hicache_diag.logs.files import parse_log_file
from hicache_diag.logs.lines import normalise
from hicache_diag.logs.model import KEEP, KEEP_PROGRESS
from hicache_diag.logs.parse import MAX_BLOCK, parse_log_lines

SAMPLES = Path(__file__).resolve().parents[3] / "samples"
LOGS = sorted(SAMPLES.glob("logs/*.log")) + sorted((SAMPLES / "corpus").rglob("*.log"))


def _summary(ev):
    return (
        [(e.rank, e.lineno, e.text, tuple(e.frames)) for e in ev.exceptions],
        [(ln.lineno, ln.text) for ln in ev.hang_lines + ev.soft_lines + ev.debug_lines],
        [(ln.lineno, ln.text) for ln in ev.cascade_lines],
        [(f.fact, f.line.lineno) for f in ev.fates],
        ev.progress_count,
        ev.served,
        len(ev.dumps),
        ev.noise,
        ev.context,
        sorted((r.key, ln.lineno, ln.ts, ln.text) for r, ln in ev.ranks_seen.items()),
        [(ln.rank, ln.ts, ln.lineno, ln.text) for ln in ev.progress_lines],
        ev.progress_last,
        ev.recognised,
        ev.lines,
    )


@pytest.mark.parametrize("log", LOGS, ids=lambda p: str(p.relative_to(SAMPLES)))
def test_the_fast_path_reads_every_log_as_the_full_path_does(log):
    lines = log.read_text(errors="replace").splitlines()
    fast = parse_log_lines(lines, str(log))
    full = parse_log_lines(lines, str(log), fast=False)
    assert _summary(fast) == _summary(full)


@pytest.mark.parametrize("log", LOGS[::3], ids=lambda p: str(p.relative_to(SAMPLES)))
def test_a_log_read_from_its_file_reads_as_its_lines_do(log):
    # From a file, lines keep their newlines and plain runs go through as blocks. (Split on
    # newlines as the file reader does: splitlines() also splits on form feeds and the like.)
    lines = log.read_bytes().decode(errors="replace").removesuffix("\n").split("\n")
    assert _summary(parse_log_file(log)) == _summary(parse_log_lines(lines, str(log), fast=False))


def _busy_log(n: int) -> list[str]:
    """A busy server's lines with, here and there, what must leave the block path: triggers,
    HiCache's name, a noise line and its traceback, blank messages, lines of no rank, a stamp
    that changes format, a carrier, a CRI partial line."""
    out = []
    for k in range(n):
        ts = f"2026-01-01 00:{k // 60 % 60:02d}:{k % 60:02d}"
        rank = f"PP{k % 2} TP{k // 2 % 2}"
        out.append(
            [
                f"[{ts} {rank}] Decode batch, #running-req: {k % 7}, gen throughput (token/s): 9",
                f"[{ts} {rank}] Prefill batch, #new-seq: 1, #cached-token: {k}",
                f'[{ts}] INFO:     10.0.0.1:{k} - "POST /generate HTTP/1.1" 200 OK',
                f"[{ts} {rank}] WARNING: something benign {k}",
                f"[{ts} {rank}] ",
                f"[{ts}] The server is fired up and ready to roll!",
                f"[{ts} {rank}]\tDecode batch, after a tab",
                f'[{ts}] INFO: "GET /health HTTP/1.1" 200 OK, "GET /x HTTP/1.1" 200 OK',
                f"[{ts} {rank}] cache [x] Decode batch, in a message",
                f"[{ts} {rank}]  Decode batch after two blanks",
                f'[{ts}] gen throughput 3, "POST /generate HTTP/1.1" 200 OK',
                f"[{ts} {rank}] Prefill batch. #running-req: 1",
            ][k % 12]
        )
        if k % 997 == 5:
            out.append(f"[{ts} {rank}] Ignore import error when loading sglang.x: no module")
            out += [
                "Traceback (most recent call last):",
                '  File "x.py", line 1, in f',
                "ImportError: no",
            ]
        if k % 1499 == 7:
            out.append(f"[{ts} {rank}] NCCL INFO comm 0x1 rank 0 nranks 2 - Init COMPLETE")
        if k % 2111 == 9:
            out.append(f"[{ts} {rank}] HiCache storage backend file ready")
        if k % 1777 == 3:
            out.append(f"2026-01-01T00:00:00.000000001Z stdout P [{ts} {rank}] Decode ")
            out.append("2026-01-01T00:00:00.000000002Z stdout F batch, #running-req: 1")
        if k % 1303 == 11:
            out.append(f"[{ts[11:]} TP0] old stamp, #running-req: 3")
    return out


@pytest.mark.parametrize("newlines", [False, True])
def test_block_reading_agrees_with_the_full_path_on_a_mixed_busy_log(newlines, tmp_path):
    lines = _busy_log(12_000)
    log = tmp_path / "busy.log"
    log.write_text("".join(s + "\n" for s in lines))
    full = _summary(parse_log_lines(lines, str(log), fast=False))
    feed = [s + "\n" for s in lines] if newlines else lines
    assert _summary(parse_log_lines(feed, str(log))) == full
    assert _summary(parse_log_file(log)) == full


def test_the_reader_stays_a_bounded_distance_behind_the_stream():
    pulled = 0

    def stream():
        nonlocal pulled
        for n in range(300_000):
            pulled += 1
            yield f"[2026-01-01 00:00:{n % 60:02d} PP{n % 2} TP0] Decode batch, #running-req: 4\n"

    def on_line(n):
        assert pulled - n <= MAX_BLOCK + 2000  # the probe for paste damage, then one block

    ev = parse_log_lines(stream(), "big.log", on_line)
    assert ev.lines == 300_000 and ev.progress_count == 300_000
    assert len(ev.progress_lines) <= 2 * KEEP_PROGRESS


def test_repeated_errors_are_counted_not_all_kept():
    line = "[2026-01-01 00:00:00 TP0] RuntimeError: the same thing again"
    ev = parse_log_lines([line] * (KEEP + 250), "x")
    assert len(ev.exceptions) == KEEP and ev.dropped == 250


def test_gzip_logs_are_read_directly_and_a_cut_gzip_up_to_its_end(tmp_path):
    text = "".join(
        f"[2026-01-01 00:00:{n:02d} PP1 TP0] Decode batch, #running-req: 2\n" for n in range(50)
    )
    gz = tmp_path / "server.log.gz"
    gz.write_bytes(gzip.compress(text.encode()))
    plain = tmp_path / "server.log"
    plain.write_text(text)
    assert parse_log_file(gz).progress_count == parse_log_file(plain).progress_count == 50
    cut = tmp_path / "cut.gz"
    cut.write_bytes(gz.read_bytes()[:-12])  # no end-of-stream marker
    assert 0 < parse_log_file(cut).progress_count <= 50


def test_a_file_with_gzips_magic_and_garbage_is_an_os_error(tmp_path):
    bad = tmp_path / "bad.log"
    bad.write_bytes(b"\x1f\x8b\x08\x00" + b"not deflate at all" * 10)
    with pytest.raises(OSError):
        parse_log_file(bad)


def test_progress_is_reported_while_reading(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("[2026-01-01 00:00:00 TP0] hello\n" * 20_000)
    seen = []
    parse_log_file(log, lambda done, total: seen.append((done, total)))
    assert seen and all(t == log.stat().st_size for _, t in seen)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_lines_that_share_one_length_are_not_taken_for_a_wrap():
    # Templated batch lines are often all one length: only a full-width line that the next
    # line continues is a wrap.
    line = "[2026-01-01 00:00:00 TP0] Decode batch, #running-req: 1, gen throughput (token/s): 9.99"
    lines = [line] * 10 + ['  File "/s/x.py", line 1, in f', "    x()"]
    assert list(normalise(lines)) == lines


def test_a_wrap_at_an_uncommon_width_is_joined():
    text = "x" * 300
    wrapped = [text[i : i + 116] for i in range(0, 300, 116)] * 2
    assert list(normalise(wrapped)) == [text, text]
