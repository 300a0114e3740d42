"""The block reader reads lines by their shapes (logs/shapes.py): what it asks of a shape must
not depend on which figure a line holds, and a big log read block by block, as delivered
(plain, behind a tag, two servers interleaved, hard-wrapped, gzip'd), reads as the full path
reads it line by line."""

from __future__ import annotations

import gzip
import re
import textwrap

import pytest

from hicache_diag.logs import block as block_mod
from hicache_diag.logs import shapes, textblock
from hicache_diag.logs.files import parse_log_file
from hicache_diag.logs.parse import parse_log_lines
from hicache_diag.logs.triggers import (
    BLOCK_TRIGGER,
    BLOCK_TRIGGER_WORDS,
    HICACHE_WORDS,
    PROGRESS_HINT,
)
from hicache_diag.rules import rank_labels
from hicache_diag.rules import signatures as sig
from tests.unit.triage.test_triage_stream import _summary


def test_the_tests_asked_of_a_shape_hold_no_figure_but_zero():
    # A `0` in a word makes the shape's answer a superset (the safe side); 1-9 would not.
    texts = [
        BLOCK_TRIGGER.pattern,
        *BLOCK_TRIGGER_WORDS,
        *HICACHE_WORDS,
        PROGRESS_HINT.pattern,
        sig.PROGRESS.pattern,
        shapes._BATCH.pattern,
        shapes.SERVED_SHAPE.pattern,
        block_mod._GLUED.pattern,
        block_mod._ISO_SHAPE.pattern[4:],  # after its `[00`: the `[20` is tested apart
        textblock._DATED.pattern,
        rank_labels._INSIDE.pattern,  # a label read from its shape (logs/textblock.py)
        rank_labels._DAMAGED_INSIDE.pattern,
    ]
    assert [t for t in texts if re.search(r"(?<!\\)[1-9]", re.sub(r"\{\d+(,\d*)?\}", "", t))] == []


def test_an_access_lines_status_is_read_from_the_line_not_its_shape():
    ok = '[2026-01-01 00:00:01] INFO:     10.0.0.1:5 - "POST /generate HTTP/1.1" 200 OK'
    failed = ok.replace("200 OK", "500 Internal Server Error").replace("0:01]", "0:02]")
    lines = [ok, failed.replace("500 Internal Server Error", "503 OK")] * 20
    assert len(set(shapes.shapes_of(lines, 0))) == 1
    assert parse_log_lines(lines, "x").served == 20
    assert parse_log_lines(lines, "x").served == parse_log_lines(lines, "x", fast=False).served


def _server(n: int, base: int = 0) -> list[str]:
    out = []
    for k in range(n):
        ts = f"2026-06-24 15:{(base + k) // 60 % 60:02d}:{(base + k) % 60:02d}"
        rank = f"PP{k % 2} TP{k // 2 % 2}"
        out.append(
            [
                f"[{ts} {rank}] Decode batch, #running-req: 3, #token: {k}, gen throughput: 9.1",
                f"[{ts} {rank}] Prefill batch, #new-seq: 2, #cached-token: {k}",
                f'[{ts}] INFO:     10.0.0.7:{k} - "POST /v1/chat HTTP/1.1" {200 + k % 3 * 150} OK',
                f"[{ts} {rank}] WARNING: Prefetch paused (prefetch_tokens_occupied={k})",
                f"[{ts} {rank}] ",
                f"[{ts}] The server is fired up and ready to roll!",
            ][k % 7 % 6]
        )
        if k % 1999 == 1998:
            out.append(f"[{ts} PP0 TP0] HiCache storage backend file ready")
        if k % 2999 == 2998:
            out += [f"[{ts} TP1] Ignore import error when loading sglang.x", "Traceback (m"]
        if k % 3001 == 3000:
            out.append(f"[{ts} PP1 TP0] NCCL INFO comm 0x1 rank 0 nranks 2 - Init COMPLETE")
    return [*out, "[2026-06-24 16:00:00 PP1 TP0] IndexError: pop from empty list"]


def _delivered(how: str, lines: list[str]) -> list[str]:
    if how == "tagged":
        return [f"gpu-node-3.cluster [stderr] {k:07d} {s}" for k, s in enumerate(lines)]
    if how == "interleaved":
        return [x for pair in zip(lines, _server(len(lines), 17), strict=False) for x in pair]
    if how == "wrapped":
        return [p for s in lines for p in (textwrap.wrap(s, 120) or [""])]
    return lines


@pytest.mark.parametrize("how", ["plain", "tagged", "interleaved", "wrapped", "gzip"])
def test_a_big_log_reads_by_blocks_as_the_full_path_reads_it(how, tmp_path):
    lines = _delivered(how, _server(12_000))
    text = "".join(s + "\n" for s in lines)
    log = tmp_path / "server.log"
    if how == "gzip":
        log = tmp_path / "server.log.gz"
        log.write_bytes(gzip.compress(text.encode()))
    else:
        log.write_text(text)
    full = _summary(parse_log_lines(lines, str(log), fast=False))
    assert _summary(parse_log_file(log)) == full
    assert _summary(parse_log_lines(lines, str(log))) == full
