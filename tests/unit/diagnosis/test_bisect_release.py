"""The release axis's verdict line: the first release where the failure rate changes, found by
splitting the releases (in version order) into earlier and later, stated only when the two
pooled rates' 95% Wilson intervals are apart."""

from __future__ import annotations

from hicache_diag.diagnosis.bisect_table import RELEASE_AXIS, BisectTable, BisectTrial, Cell


def _cell(python: str, failures: int, trials: int) -> Cell:
    results = [
        BisectTrial(i, f"d{i}", "crash" if i < failures else "ok", "B" if i < failures else None)
        for i in range(trials)
    ]
    return Cell({RELEASE_AXIS: python}, results)


def _table(rows: list[tuple[str, int, int]]) -> BisectTable:
    cells = [_cell(f"/v/{v}/bin/python", f, t) for v, f, t in rows]
    return BisectTable(
        [RELEASE_AXIS], cells, releases={f"/v/{v}/bin/python": v for v, _, _ in rows}
    )


def test_a_step_names_the_first_release_without_failures():
    table = _table([("0.5.18", 3, 3), ("0.5.19", 3, 3), ("0.5.20", 0, 3), ("0.5.21", 0, 3)])
    assert table.verdict() == [
        "first release where the failure rate drops: 0.5.20 "
        "(0.5.18..0.5.19: 6/6 (100%) vs 0.5.20..0.5.21: 0/6 (0%))"
    ]


def test_releases_are_ordered_by_version_not_as_given():
    table = _table([("0.5.21", 0, 4), ("0.5.9", 4, 4), ("0.5.12.post1", 4, 4)])
    line = table.verdict()[0]
    assert line.startswith("first release where the failure rate drops: 0.5.21 ")
    assert "(0.5.9..0.5.12.post1: 8/8 (100%) vs 0.5.21: 0/4 (0%))" in line


def test_overlapping_intervals_conclude_nothing():
    # 3/3 vs 0/3: [0.44, 1] and [0, 0.56] overlap
    line = _table([("0.5.18", 3, 3), ("0.5.21", 0, 3)]).verdict()[0]
    assert "the 95% intervals overlap, no conclusion yet (raise --trials)" in line
    assert "first release" not in line


def test_a_regression_is_a_rise():
    line = _table([("0.5.18", 0, 5), ("0.5.21", 5, 5)]).verdict()[0]
    assert line == (
        "first release where the failure rate rises: 0.5.21 "
        "(0.5.18: 0/5 (0%) vs 0.5.21: 5/5 (100%))"
    )


def test_no_failures_and_no_change():
    assert _table([("0.5.18", 0, 3), ("0.5.21", 0, 3)]).verdict() == ["no failures in 6 trials"]
    assert _table([("0.5.18", 2, 4), ("0.5.21", 2, 4)]).verdict() == [
        "release: the same failure rate in every release (0.5.18, 0.5.21)"
    ]


def test_without_versions_the_given_order_and_paths_are_used():
    cells = [_cell("/a/python", 4, 4), _cell("/b/python", 0, 4)]
    lines = BisectTable([RELEASE_AXIS], cells).verdict()
    assert lines[0].startswith("first release where the failure rate drops: /b/python ")
    assert not any("removes all failures" in x for x in lines)


def test_json_names_each_interpreters_release():
    table = _table([("0.5.18", 4, 4), ("0.5.21", 0, 4)])
    data = table.to_json()
    assert data["releases"] == {"/v/0.5.18/bin/python": "0.5.18", "/v/0.5.21/bin/python": "0.5.21"}
    assert "releases" not in BisectTable(["ack-count"], []).to_json()  # other bisects unchanged
