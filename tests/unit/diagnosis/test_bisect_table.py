"""Bisect verdict lines state a difference only when the 95% Wilson intervals are apart."""

from __future__ import annotations

from hicache_diag.diagnosis.bisect_table import BisectTable, BisectTrial, Cell


def _cell(values: dict[str, str], failures: int, trials: int) -> Cell:
    results = [
        BisectTrial(i, f"d{i}", "crash" if i < failures else "ok", "A" if i < failures else None)
        for i in range(trials)
    ]
    return Cell(values, results)


def _verdict(cells: list[Cell], axes: list[str]) -> str:
    return " | ".join(BisectTable(axes, cells).verdict())


def test_two_against_two_trials_states_no_conclusion():
    # the Ctrl-C'd bisect of issue 22: 2/2 failures vs 0/2 overlap ([0.34, 1] vs [0, 0.66])
    cells = [_cell({"host-alloc": "local"}, 2, 2), _cell({"host-alloc": "two-phase"}, 0, 2)]
    text = _verdict(cells, ["host-alloc"])
    assert "removes all failures" not in text
    want = "host-alloc (two-phase: 0/2 (0%) vs local: 2/2 (100%)): the 95% intervals overlap"
    assert want in text


def test_enough_trials_name_the_switch():
    cells = [_cell({"host-alloc": "local"}, 8, 8), _cell({"host-alloc": "two-phase"}, 0, 8)]
    assert "host-alloc=two-phase removes all failures" in _verdict(cells, ["host-alloc"])


def test_host_size_trend_needs_separate_intervals():
    few = [_cell({"hicache-size": "16MiB"}, 1, 4), _cell({"hicache-size": "64MiB"}, 3, 4)]
    assert "intervals overlap" in _verdict(few, ["hicache-size"])
    many = [_cell({"hicache-size": "16MiB"}, 0, 12), _cell({"hicache-size": "64MiB"}, 12, 12)]
    assert "rate falls with a smaller host size" in _verdict(many, ["hicache-size"])
