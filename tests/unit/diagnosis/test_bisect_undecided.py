"""A trial that decided nothing (the tool's own trial timeout or step budget, an interruption,
no verdict) is `undecided` with its cause in every table, and bisect never concludes from it."""

from __future__ import annotations

from hicache_diag.cli.render.bisect import table_markdown
from hicache_diag.diagnosis.bisect_table import (
    BisectTable,
    BisectTrial,
    Cell,
    undecided_trial,
)

TIMEOUT = "trial timeout 0.001s"


def _timed_out(i: int) -> BisectTrial:
    return undecided_trial(i, f"d{i}", TIMEOUT, "timed out after 0.001s (--trial-timeout)")


def test_no_finished_trial_concludes_nothing():
    cells = [Cell({"ack-count": v}, [_timed_out(i) for i in range(2)]) for v in ("local", "leader")]
    table = BisectTable(["ack-count"], cells)
    lines = table.verdict()
    assert lines == [
        "no trial finished: nothing concluded (4 undecided: trial timeout 0.001s: 4); raise "
        "--trial-timeout (or --max-steps) until trials end with a verdict"
    ]
    assert not any("no failures" in line for line in lines)
    assert table.exit_code == 3 and not table.concluded
    data = table.to_json()
    assert data["undecided"] == 4 and data["undecided_causes"] == {TIMEOUT: 4}
    assert data["concluded"] is False
    cell = data["cells"][0]
    assert (cell["trials"], cell["failures"], cell["undecided"]) == (0, 0, 2)
    assert not any(r.failed for c in cells for r in c.results)


def test_table_md_has_its_own_undecided_column_with_the_cause():
    cells = [
        Cell({"ack-count": "local"}, [_timed_out(0), BisectTrial(1, "d1", "crash", "A", 2.0)]),
        Cell({"ack-count": "leader"}, [BisectTrial(0, "d0", "ok"), BisectTrial(1, "d1", "ok")]),
    ]
    md = table_markdown(BisectTable(["ack-count"], cells))
    head = next(line for line in md.splitlines() if line.startswith("| ack-count"))
    assert head.split(" | ")[-1] == "undecided |"
    assert "| local | 1 | 1 | 100% |" in md and "| 1 (trial timeout 0.001s: 1) |" in md
    assert "| leader | 2 | 0 | 0% |" in md and md.count("| - |") >= 1


def test_some_undecided_are_said_and_left_out_of_the_rates():
    budget = undecided_trial(2, "d2", "step budget", "undecided: step budget exhausted ...")
    cells = [
        Cell({"ack-count": "local"}, [BisectTrial(i, f"d{i}", "crash", "A") for i in range(6)]),
        Cell({"ack-count": "leader"}, [BisectTrial(i, f"d{i}", "ok") for i in range(6)] + [budget]),
    ]
    table = BisectTable(["ack-count"], cells)
    lines = table.verdict()
    assert lines[0] == (
        "1 of 13 trials undecided (step budget: 1): the rates count only the 12 that finished"
    )
    assert any("ack-count=leader removes all failures" in line for line in lines)
    assert table.exit_code == 0 and cells[1].to_json()["trials"] == 6
