"""The first-divergence block (first_divergence/rank{r}.json): its record both ways, its reader,
the step tail it is built from, and what `report` and `export` make of it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from hicache_diag import evidence as ev
from hicache_diag.cli.main import run_cli
from hicache_diag.cli.render.divergence_block import markdown_blocks, render_blocks
from hicache_diag.diagnosis.consensus import checker_silent
from hicache_diag.evidence import divergence
from hicache_diag.export.divergence_block import block_section

RUNS = Path(__file__).resolve().parents[2] / "samples" / "runs"
FORM_B = RUNS / "sglang-0.5.23-form-b"
EVENTS = {
    0: ["match_prefix called params=a", "evict called params={'n': 96}", "insert returns 3"],
    1: ["match_prefix called params=a", "insert called params=len(params.key)=58"],
}


def _block(rank: int, **kw) -> ev.DivergenceBlock:
    steps = [ev.StepRecord(rank=rank, step=40, rids=["r0003"]), ev.StepRecord(step=41, idle=True)]
    stack = ev.ThreadDump(name="MainThread", ident=1, daemon=False, frames=["a.py:1 in f"])
    values = {
        "rank": rank,
        "pp": rank,
        "tp": 0,
        "pid": 100 + rank,
        "t": 1.5,
        "thread": "rank_consensus_checker",
        "n_events": len(EVENTS[rank]),
        "local_hash": f"{rank}abc",
        "events": EVENTS[rank],
        "checker_line": "Found rank divergence for 3 events(s)! ...",
        "step": 42,
        "steps": steps,
        "queues": {"ack_write_queue": rank, "load_queue": 0},
        "device_free": 200 - rank,
        "host_free": None,
        "tree_digest": "d",
        "stacks": [stack],
    }
    values.update(kw)
    return ev.DivergenceBlock(**values)


def test_a_block_reads_back_as_written_typed_and_lossless(tmp_path):
    block = _block(1)
    path = ev.write_block(tmp_path, block)
    assert path == tmp_path / "first_divergence" / "rank1.json"
    assert [p.name for p in path.parent.iterdir()] == ["rank1.json"]  # no temp file left
    back = ev.read_blocks(tmp_path)[1]
    assert back.to_json() == block.to_json()
    assert isinstance(back.steps[0], ev.StepRecord) and back.steps[0].rids == ["r0003"]
    assert isinstance(back.stacks[0], ev.ThreadDump) and back.stacks[0].frames == ["a.py:1 in f"]
    assert back.last_step is not None and back.last_step.step == 40  # the last busy one
    data = json.loads(path.read_text()) | {"newer_key": 7}
    path.write_text(json.dumps(data))
    assert ev.read_blocks(tmp_path)[1].to_json() == data  # a newer writer's key is kept


def test_reader_finds_none_and_names_a_damaged_file(tmp_path):
    assert ev.read_blocks(tmp_path) == {}
    ev.write_block(tmp_path, _block(0))
    bad = ev.divergence_json(tmp_path, 1)
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match="rank1.json"):
        ev.read_blocks(tmp_path)


def test_tail_steps_keeps_the_last_whole_lines(tmp_path, monkeypatch):
    path = tmp_path / "rank0.jsonl"
    lines = [json.dumps({"step": i, "rank": 0, "pad": "x" * 50}) for i in range(40)]
    path.write_text("\n".join(lines) + '\n{"step": 40, "ra')  # the writer's line, torn
    assert [s.step for s in ev.tail_steps(path, 5)] == [35, 36, 37, 38, 39]
    monkeypatch.setattr(divergence, "TAIL_BYTES", 200)  # the cut first line is dropped
    assert [s.step for s in ev.tail_steps(path, 16)] == [38, 39]
    assert ev.tail_steps(tmp_path / "missing.jsonl") == []


def test_events_are_read_from_the_checkers_line():
    line = f"Found rank divergence for 2 events(s)! local hash: ab, events = {EVENTS[1]}"
    assert divergence.events_of(line) == EVENTS[1]
    assert divergence.events_of("Found rank divergence, events = [oops") == []


def test_console_and_markdown_show_every_rank_and_the_first_differing_event():
    blocks = {0: _block(0), 1: _block(1)}
    console = Console(record=True, width=200)
    render_blocks(blocks, [0, 1, 2], console)
    text = console.export_text()
    assert "first-divergence block" in text and "no block from rank(s) [2]" in text
    assert "first differing event (#1 of the checked batch)" in text
    assert "rank 0: evict called params={'n': 96}" in text
    assert "rank 1: insert called params=len(params.key)=58" in text
    assert "ack_write_queue=1" in text and "rank 1 last busy step 40" in text
    md = "\n".join(markdown_blocks(blocks, [0, 1]))
    assert "| 1 | 1 | 0 | 42 | 2 | 1abc | 199 | - | ack_write_queue=1 |" in md
    assert render_blocks({}, [0], console) is None and markdown_blocks({}, [0]) == []


def test_export_section_names_the_event_the_ranks_first_disagree_on():
    lines = block_section({0: _block(0), 1: _block(1)}, [0, 1])
    text = "\n".join(lines)
    assert "First differing event (#1 of the checked batch)" in text
    assert "rank 0: evict called params={'n': 96}" in text
    assert "| 0 | 0 | 0 | 42 | 3 | `0abc` | 200 | None | empty |" in text
    same = {r: _block(r, events=EVENTS[0]) for r in (0, 1)}
    assert "First differing event" not in "\n".join(block_section(same, [0, 1]))


def test_report_on_a_run_with_blocks_shows_them(tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(FORM_B, run)
    for rank in (0, 1):
        ev.write_block(run, _block(rank))
    assert run_cli(["report", str(run)]) == 0
    out = capsys.readouterr().out
    assert "first-divergence block (SGLang's rank consensus checker)" in out
    assert "rank 1: insert called params=len(params.key)=58" in out
    ev.divergence_json(run, 1).write_text("not json")
    assert run_cli(["report", str(run)]) == 0
    assert "first-divergence block unreadable" in capsys.readouterr().out


def test_a_silent_checker_is_a_note_and_a_fired_one_without_blocks_another():
    on = "[PP0] Rank consensus checker is enabled. The server will suicide if ...\n"
    fired = on + "Found rank divergence for 1 events(s)! local hash: ab, events = ['x']\n"
    assert checker_silent({0: "plain log\n"}, {}) is None
    assert checker_silent({0: on, 1: on}, {0: _block(0)}) is None
    assert "reported no divergence before the run ended" in checker_silent({0: on}, {})
    assert "no rank wrote a first-divergence block" in checker_silent({0: fired}, {})
