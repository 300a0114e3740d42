"""`hicache-diag export` given a shrink's dir: a shrink that kept no failing run is refused in
one line (there is nothing shrunk to export)."""

from __future__ import annotations

import json

from hicache_diag.cli.main import run_cli


def test_a_shrink_that_kept_no_failing_run_is_refused(capsys, tmp_path):
    shrink = tmp_path / "shrink"
    shrink.mkdir()
    record = {"schema": "hicache-diag/shrink/v1", "last_failing": None, "stopped": "not reproduced"}
    (shrink / "shrink.json").write_text(json.dumps(record))
    assert run_cli(["export", str(shrink), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no shrunk failing run to export" in err[0], err
    assert not (tmp_path / "x").exists()
