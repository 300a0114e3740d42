"""The recorder's production sink (issue 37): the same step lines as a run's rank{r}.jsonl, into
a recording's bounded files through a writer thread of its own; a slow or stuck disk turns the
rank off instead of ever holding up the scheduler thread."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from hicache_diag.engines.sglang.plugin import sinks
from hicache_diag.engines.sglang.plugin.recorder import MUST_AGREE, StepRecorder
from hicache_diag.evidence import recording as rec
from hicache_diag.faults.hooks import Hooks


def _recording(tmp_path, on_off=None) -> rec.RankRecording:
    meta = rec.RankMeta(1, 1, 0, 1, "h", "0.5.23", list(MUST_AGREE), 0.0, {})
    return rec.RankRecording(tmp_path / "s", meta, rec.Limits(reserve_bytes=0), on_off)


def _steps(recorder: StepRecorder, n: int) -> None:
    batch = SimpleNamespace(reqs=[SimpleNamespace(rid="r1", prefix_len=0)], forward_mode=None)
    for _ in range(n):
        recorder.begin_step()
        recorder.end_step(object(), batch)


def test_the_production_sink_writes_the_runs_very_lines(tmp_path):
    said: list[str] = []
    sink = sinks.RecordingSink(_recording(tmp_path), MUST_AGREE, said.append)
    production = StepRecorder(sink, 1, 1, 0, Hooks(rank=1, pp_rank=1))
    run = StepRecorder(str(tmp_path / "rank1.jsonl"), 1, 1, 0, Hooks(rank=1, pp_rank=1))
    _steps(production, 5)
    _steps(run, 5)
    production.close()
    run.close()
    view = rec.read_rank(tmp_path / "s", 1)
    ran = (tmp_path / "rank1.jsonl").read_text().splitlines()
    assert [ln["step"] for ln in view.lines] == [0, 1, 2, 3, 4] and len(ran) == 5
    strip = [{k: v for k, v in ln.items() if k != "t"} for ln in view.lines]
    assert strip == [{k: v for k, v in rec_line.items() if k != "t"} for rec_line in _json(ran)]
    assert [s for s, _ in view.digests] == [0, 1, 2, 3, 4] and said == []
    assert len(production.tail) == 5 and view.meta.last_step == 4


def _json(lines: list[str]) -> list[dict]:
    import json

    return [json.loads(ln) for ln in lines]


def test_the_writer_thread_writes_without_being_asked(tmp_path):
    sink = sinks.RecordingSink(_recording(tmp_path), MUST_AGREE, lambda reason: None)
    sink.write({"step": 7, "rids": ["a"]}, '{"step": 7}')
    deadline = time.monotonic() + 5
    while not rec.read_rank(tmp_path / "s", 1).digests and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [s for s, _ in rec.read_rank(tmp_path / "s", 1).digests] == [7]
    sink.close()


def test_a_stuck_disk_turns_the_rank_off_without_holding_the_scheduler(tmp_path, monkeypatch):
    monkeypatch.setattr(sinks, "SLOW_S", 0.2)
    said: list[str] = []
    recording = _recording(tmp_path)
    stuck, release = threading.Event(), threading.Event()

    def write_steps(items):  # a write on a hung mount: never returns until released
        stuck.set()
        release.wait(10)

    recording.write_steps = write_steps
    sink = sinks.RecordingSink(recording, MUST_AGREE, said.append)
    try:
        sink.write({"step": 0}, "{}")
        assert stuck.wait(5)
        time.sleep(0.3)
        start = time.monotonic()
        for step in range(1, 50):
            sink.write({"step": step}, "{}")
        assert time.monotonic() - start < 0.1  # the scheduler thread never waited
        assert said == ["disk too slow: one write has taken over 0 s"] and not sink.on
    finally:
        release.set()
    deadline = time.monotonic() + 5
    while recording.on and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not recording.on  # the meta says so once the disk answers again


def test_too_many_lines_waiting_turn_the_rank_off(tmp_path, monkeypatch):
    monkeypatch.setattr(sinks, "MAX_PENDING", 3)
    monkeypatch.setattr(sinks, "WRITE_EVERY_S", 60.0)  # the writer thread never gets to them
    said: list[str] = []
    sink = sinks.RecordingSink(_recording(tmp_path), MUST_AGREE, said.append)
    for step in range(5):
        sink.write({"step": step}, "{}")
    assert said == ["disk too slow: 3 step lines waiting to be written"]


def test_a_disk_error_in_the_writer_turns_the_rank_off_once(tmp_path):
    said: list[str] = []
    recording = _recording(tmp_path, on_off=said.append)
    sink = sinks.RecordingSink(recording, MUST_AGREE, said.append)
    (tmp_path / "s" / "rank1.jsonl").mkdir()  # the lines file cannot be opened
    sink.write({"step": 0}, "{}")
    sink.flush()
    sink.write({"step": 1}, "{}")
    assert not sink.on and not recording.on
    assert len(said) >= 1 and len(set(said)) == 1 and "IsADirectoryError" in said[0]
