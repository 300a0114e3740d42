"""The dynamic half of `sources` on small hand-made run dirs: values that differ across ranks or
do not, a decision acting on one rank only, idle ranks, dead ranks, and what is bad input; and the
recorder that writes the `sources` field (evidence/probes.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hicache_diag.engines.sglang.plugin import source_probes
from hicache_diag.engines.sglang.plugin.hook_points import STATE
from hicache_diag.engines.sglang.plugin.recorder import StepRecorder
from hicache_diag.errors import RunDirError
from hicache_diag.sources.dynamic import analyze_run

ARMED = ["l3-control-queues", "session-clock"]


def _line(step: int, rank: int, sources: dict | None = None, **extra) -> dict:
    line = {"step": step, "rank": rank, "pp": rank, "tp": 0, **extra}
    if sources is not None:
        line["sources"] = sources
    return line


def _run(tmp_path: Path, ranks: dict[int, list[dict]]) -> Path:
    for rank, lines in ranks.items():
        lines = [dict(lines[0], sources_armed=ARMED), *lines[1:]] if lines else lines
        text = "".join(json.dumps(line) + "\n" for line in lines)
        (tmp_path / f"rank{rank}.jsonl").write_text(text)
    return tmp_path


def _by_name(result) -> dict:
    return {s.name: s for s in result.sources}


def test_equal_values_and_equal_decisions_are_not_marked(tmp_path):
    rec = {"n": 1, "v": [[1, 0, 0]], "d": [[1, 0, 0]]}
    run = _run(
        tmp_path, {r: [_line(s, r, {"l3-control-queues": rec}) for s in (3, 4)] for r in (0, 1)}
    )
    s = _by_name(analyze_run(run))["l3-control-queues"]
    assert (s.steps_read, s.steps_compared, s.steps_differed, s.steps_decided) == (2, 2, 0, 2)
    assert (s.steps_marked, s.steps_apart, s.marked, s.first_differed) == (0, 0, False, None)
    assert s.classic == "l3-progress" and s.decision == "storage-queue-drain"


def test_values_that_differ_where_the_decision_acted_are_marked_with_each_rank(tmp_path):
    same = {"n": 1, "v": [[0, 0, 0]]}
    run = _run(
        tmp_path,
        {
            0: [
                _line(5, 0, {"l3-control-queues": same}),
                _line(6, 0, {"l3-control-queues": {"n": 1, "v": [[1, 0, 0]], "d": [[1, 0, 0]]}}),
                _line(8, 0),
            ],
            1: [
                _line(5, 1, {"l3-control-queues": same}),
                _line(6, 1, {"l3-control-queues": {"n": 1, "v": [[0, 0, 0]]}}),
                _line(7, 1, {"l3-control-queues": {"n": 1, "v": [[1, 0, 0]], "d": [[1, 0, 0]]}}),
            ],
        },
    )
    s = _by_name(analyze_run(run))["l3-control-queues"]
    assert (s.steps_differed, s.steps_marked, s.steps_apart) == (1, 2, 2)
    first = s.first_marked
    assert first.step == 6 and first.decided
    assert first.values == {0: [[1, 0, 0]], 1: [[0, 0, 0]]}
    assert first.outcomes == {0: [[1, 0, 0]], 1: []}
    # Step 7: rank 1 drained, rank 0 has no line there: idle, its drain did nothing.
    assert s.first_apart.step == 6 and s.steps_apart == 2


def test_an_idle_rank_is_compared_as_deciding_nothing_and_a_dead_one_not_at_all(tmp_path):
    reap = {"n": 1, "v": [12.5], "d": [1]}
    run = _run(
        tmp_path,
        {
            0: [
                _line(0, 0, {"session-clock": {"n": 1, "v": [10.0]}}),
                _line(9, 0, {"session-clock": reap}),
            ],
            1: [_line(0, 1, {"session-clock": {"n": 1, "v": [10.001]}}), _line(5, 1, crashed=True)],
            2: [_line(0, 2, {"session-clock": {"n": 1, "v": [10.002]}}), _line(12, 2)],
        },
    )
    result = analyze_run(run)
    s = _by_name(result)["session-clock"]
    assert result.last_step == {0: 9, 1: 4, 2: 12}  # rank 1 died inside step 5
    assert (s.steps_read, s.steps_compared, s.steps_differed, s.steps_marked) == (2, 1, 1, 1)
    assert s.first_differed.step == 0 and not s.first_differed.decided
    # Step 9: rank 1 died at step 4 (left out), rank 2 went past it idle: it closed nothing.
    assert s.first_apart.step == 9 and s.first_apart.outcomes == {0: [1], 2: []}
    assert s.first_marked.step == 9  # its values were not both read: its outcome parted
    assert 1 not in s.first_apart.values
    assert any("monotonic" in n for n in result.notes)  # clocks: their differences explained


def test_a_decision_alone_is_no_read_so_a_follower_relay_is_not_a_difference(tmp_path):
    # 0.5.2x: PP0 counts the acks, PP1 pops PP0's relayed count and reads nothing itself.
    run = _run(
        tmp_path,
        {
            0: [_line(2, 0, {"dma-ack-count.write": {"n": 1, "v": [1], "d": [1]}})],
            1: [_line(2, 1, {"dma-ack-count.write": {"n": 0, "v": [], "d": [1]}})],
        },
    )
    s = _by_name(analyze_run(run))["dma-ack-count.write"]
    assert s.ranks_read == (0,) and s.steps_compared == 0 and s.steps_apart == 0
    assert json.loads(json.dumps(analyze_run(run).to_json()))["sources"][0]["marked"] is False


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda d: d / "missing", "no such run directory"),
        (lambda d: d, r"no rank\*\.jsonl"),
        (lambda d: (d / "rank0.jsonl").write_text('{"step": 0}\n') and d, "no source reads"),
    ],
)
def test_bad_run_dirs_are_usage_errors(tmp_path, make, needle):
    with pytest.raises(RunDirError, match=needle):
        analyze_run(make(tmp_path))


def test_a_truncated_last_line_is_skipped(tmp_path):
    run = _run(tmp_path, {0: [_line(1, 0, {"host-alloc": {"n": 1, "v": [8], "d": [1]}})]})
    with open(run / "rank0.jsonl", "a") as fh:
        fh.write('{"step": 2, "sour')
    assert _by_name(analyze_run(run))["host-alloc"].steps_read == 1


class _Hooks:
    step = 0

    def drain_fired(self):
        return []


class _Queue:
    def __init__(self, n):
        self.n = n

    def qsize(self):
        return self.n


def test_recorder_writes_reads_of_acting_steps_and_drops_idle_polls(tmp_path):
    path = tmp_path / "rank0.jsonl"
    rec = StepRecorder(str(path), 0, 0, 0, _Hooks())
    rec._last_write = float("inf")  # no heartbeat in this test
    STATE.recorder = rec
    try:
        tree = type("T", (), {})()
        tree.enable_storage = True
        tree.cache_controller = type("C", (), {})()
        for name, n in zip(source_probes.CONTROL_QUEUES, (2, 0, 1), strict=True):
            setattr(tree.cache_controller, name, _Queue(n))
        for step in range(3):
            rec.begin_step()
            source_probes.read_control_queues(tree)  # read every step
            if step == 1:
                source_probes.decided("l3-control-queues", [2, 0, 1])
                source_probes.read("flush-deadline", lambda: 1 / 0)  # a failing probe
            rec.end_step(None, None)
    finally:
        STATE.recorder = None
        rec.close()
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [line["step"] for line in lines] == [1]  # steps 0 and 2 were idle polls
    assert lines[0]["sources"]["l3-control-queues"] == {"n": 1, "v": [[2, 0, 1]], "d": [[2, 0, 1]]}
    assert lines[0]["sources"]["flush-deadline"]["v"] == ["probe error: ZeroDivisionError"]
    assert lines[0]["probe_errors"] == 1 and "sources_armed" in lines[0]


class _Flush:
    """SchedulerFlushWrapper.check_pending's shape (scheduler_components/flush_wrapper.py)."""

    def __init__(self, deadline: float, idle: bool):
        self._pending, self.idle = ("req", deadline), idle

    def _is_fully_idle(self):
        return self.idle

    def check_pending(self):
        if self._pending is None:
            return
        if self.idle or self._pending[1] <= 0:
            self._pending = None


class _Drainer:
    def _drain_storage_control_queues_impl(self, n_storage_hit, n_backup, n_release, **_):
        return n_storage_hit


def test_probes_record_the_drain_counts_and_how_a_pending_flush_ended(tmp_path):
    path = tmp_path / "rank1.jsonl"
    rec = StepRecorder(str(path), 1, 1, 0, _Hooks())
    rec._last_write = float("inf")
    STATE.recorder = rec
    try:
        impl = source_probes._wrap_drain_impl(_Drainer._drain_storage_control_queues_impl)
        check = source_probes._wrap_check_pending(_Flush.check_pending)
        for hit, flush in ((0, None), (2, _Flush(-1.0, idle=False)), (0, _Flush(1e12, idle=True))):
            rec.begin_step()
            assert impl(_Drainer(), n_storage_hit=hit, n_backup=0, n_release=0) == hit
            if flush is not None:
                check(flush)
                assert flush._pending is None
            rec.end_step(None, None)
    finally:
        STATE.recorder = None
        rec.close()
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2]  # step 0 drained nothing: an idle poll
    assert lines[0]["sources"]["l3-control-queues"] == {"n": 0, "v": [], "d": [[2, 0, 0]]}
    assert lines[0]["sources"]["flush-deadline"]["d"] == ["timeout"]
    assert lines[1]["sources"]["flush-deadline"]["d"] == ["flush"]
    assert "l3-control-queues" not in lines[1]["sources"]


def test_aligned_source_differs_in_its_reads_but_never_acts_apart(tmp_path):
    # 0.5.23 with L3 (a healthy run): PP1's own queue lags PP0's, but both drain PP0's counts.
    run = _run(
        tmp_path,
        {
            0: [_line(628, 0, {"l3-control-queues": {"n": 1, "v": [[0, 2, 0]], "d": [[0, 2, 0]]}})],
            1: [_line(628, 1, {"l3-control-queues": {"n": 1, "v": [[0, 0, 0]], "d": [[0, 2, 0]]}})],
        },
    )
    s = _by_name(analyze_run(run))["l3-control-queues"]
    assert (s.steps_differed, s.steps_marked, s.steps_apart, s.first_apart) == (1, 1, 0, None)
