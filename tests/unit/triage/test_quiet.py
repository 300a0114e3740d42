"""A big log read from its file goes through logs/texts.py as Texts, which logs/quiet.py records
by their line shapes at C speed: it must read as the full path reads the same lines one by one,
whatever the Texts hold (ranks of one and two figures, access lines of every status, stamps
with and without fractions, a trigger or HiCache's name mid-Text, a stream that goes back in
time, a long line, NUL bytes, a non-ASCII line, a runner's tag, gzip)."""

from __future__ import annotations

import gzip
import random

import pytest

from hicache_diag.logs import paste, quiet, shippers, texts
from hicache_diag.logs.files import parse_log_file
from hicache_diag.logs.parse import parse_log_lines
from tests.unit.triage.test_triage_stream import _summary

N = 30_000  # lines: the head, then a few megabyte Texts


def _line(rng: random.Random, k: int, clock: list[int], frac: bool) -> str:
    clock[0] += rng.choice((0, 0, 0, 1))
    t = clock[0]
    ts = f"2026-03-{1 + t // 86400 % 28:02d} {t // 3600 % 24:02d}:{t // 60 % 60:02d}:{t % 60:02d}"
    ts += f".{rng.randrange(1000):03d}" if frac else ""
    pp, tp = rng.choice((0, 1, 10)), rng.randrange(4)
    rank = f"PP{pp} TP{tp}"
    return rng.choice(
        [
            f"[{ts} {rank}] Decode batch, #running-req: {k % 50}, #token: {k}, gen throughput "
            f"(token/s): {k % 997}.5, #queue-req: {k % 3}",
            f"[{ts} {rank}] Prefill batch, #new-seq: 1, #new-token: {k % 700}, #cached-token: {k}",
            f'[{ts}] INFO:     10.0.0.{k % 250}:{k} - "POST /generate HTTP/1.1" '
            f"{rng.choice((200, 200, 200, 404, 503, 307))} OK",
            f"[{ts} {rank}] WARNING: a benign warning number {k}",
            f"[{ts} {rank}] ",
            f"[{ts}] The server is fired up and ready to roll!",
            f"[{ts} DP{k % 2} PP{pp} TP{tp} EP{k % 3}] Decode batch, #running-req: 1",
        ]
    )


def _log(seed: int, frac: bool = False) -> list[str]:
    rng, clock = random.Random(seed), [1_000_000]
    return [_line(rng, k, clock, frac) for k in range(N)]


def _read_both(path, lines, monkeypatch) -> tuple:
    recorded = []
    original = quiet.record_text

    def counting(*args, **kw):
        stop, held = original(*args, **kw)
        recorded.append(stop)
        return stop, held

    monkeypatch.setattr("hicache_diag.logs.parse.record_text", counting)
    fast = _summary(parse_log_file(path))
    full = _summary(parse_log_lines(lines, str(path), fast=False))
    return fast, full, recorded


def _write(tmp_path, lines, name="server.log", tag=False, gz=False):
    body = "".join(
        (f"node-7.cluster [stderr] {k:07d} " if tag else "") + s + "\n" for k, s in enumerate(lines)
    )
    path = tmp_path / name
    path.write_bytes(gzip.compress(body.encode()) if gz else body.encode())
    return path, body.removesuffix("\n").split("\n")


@pytest.mark.parametrize("tag", [False, True], ids=["plain", "tagged"])
@pytest.mark.parametrize("frac", [False, True], ids=["seconds", "fractions"])
def test_texts_read_as_the_full_path_reads_their_lines(tmp_path, monkeypatch, tag, frac):
    path, lines = _write(tmp_path, _log(7, frac), tag=tag)
    fast, full, recorded = _read_both(path, lines, monkeypatch)
    assert fast == full
    assert sum(recorded) > N // 2  # most lines went the quiet way: the test tests it


def _with(lines: list[str], at: int, extra: list[str]) -> list[str]:
    return lines[:at] + extra + lines[at:]


CASES = {
    # A trigger mid-Text: the lines before it are recorded, the rest is read as a Block.
    "trigger": lambda ls: _with(ls, 17_000, ["[2026-03-12 13:47:00 PP1 TP0] RuntimeError: x"]),
    # HiCache's name first seen mid-Text: the reader must see it.
    "hicache": lambda ls: _with(ls, 16_500, ["[2026-03-12 13:47:00 PP0 TP0] HiCache storage on"]),
    # A stream that goes back in time: a line a day later whose Text ends in the same hour.
    "time travel": lambda ls: _with(ls, 20_000, ["[2026-03-20 09:00:00 PP0 TP1] Decode batch, x"]),
    # A line longer than MAX_LINE: the rest of the stream is read as characters.
    "long line": lambda ls: _with(ls, 15_000, ["[2026-03-12 13:47:00 TP0] " + "ab " * 120_000]),
    # A non-ASCII line and a NUL hole: those reads are decoded.
    "non-ascii": lambda ls: _with(ls, 14_000, ["[2026-03-12 13:47:00 TP1] KV 缓存 — ok"]),
    "nul hole": lambda ls: _with(ls, 18_000, ["[2026-03-12 13:47:00 TP1] before\x00\x00\x00after"]),
    # A rank seen only once, mid-Text: its last line must be kept.
    "lone rank": lambda ls: _with(ls, 19_000, ["[2026-03-12 13:47:00 PP3 TP7] Decode batch, #x"]),
}


@pytest.mark.parametrize("case", CASES)
def test_what_a_text_may_hold_reads_as_line_by_line(tmp_path, monkeypatch, case):
    path, lines = _write(tmp_path, CASES[case](_log(11)))
    fast, full, recorded = _read_both(path, lines, monkeypatch)
    assert fast == full
    assert recorded  # a Text was read the quiet way


def test_a_gzipped_log_reads_its_texts_as_the_plain_one(tmp_path, monkeypatch):
    path, lines = _write(tmp_path, _log(5), name="server.log.gz", gz=True)
    fast, full, recorded = _read_both(path, lines, monkeypatch)
    assert fast == full and recorded


def test_the_head_read_as_lines_covers_every_probe():
    # Texts start after the lines the stages that learn a stream from its head look at.
    assert texts.HEAD_ITEMS >= 2 * shippers._PROBE + paste._WRAP_PROBE
