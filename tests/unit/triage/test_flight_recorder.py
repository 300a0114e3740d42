"""Issue 38 part 2: Flight Recorder dumps as evidence (`triage --fr DIR`): a real dump made here
by torch's own recorder on gloo (bench/fr_capture.py: 4 ranks, rank 2 enters a broadcast where
its peers enter an all_reduce), a 2-rank gloo dump where no majority names a culprit, and the
NCCL dump shape torch's own tests build (pickle and JSON)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hicache_diag.cli.main import app
from hicache_diag.errors import UsageError
from hicache_diag.triage import TriageRequest, run_triage
from hicache_diag.triage.flight_findings import analyse
from hicache_diag.triage.flight_recorder import read_flight_dir

ROOT = Path(__file__).resolve().parents[3]
REAL = ROOT / "samples" / "flight_recorder" / "gloo-desync-4ranks"
TWO = ROOT / "tests" / "data" / "fr-gloo-2ranks-disagree"


def _entry(record, op, seq, state, pg=("0", "default_pg"), site=("train_step", "train.py", 88)):
    # The shape of torch's test_fr_analysis.create_one_entry, with frames as NCCL dumps hold.
    return {
        "record_id": record,
        "profiling_name": f"nccl:{op}",
        "state": state,
        "process_group": pg,
        "input_sizes": [[4, 4]],
        "output_sizes": [[4, 4]],
        "input_dtypes": ["Float"],
        "output_dtypes": ["Float"],
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "time_created_ns": 0,
        "is_p2p": False,
        "frames": [
            {"name": "all_reduce", "filename": "/x/torch/distributed/c10d.py", "line": 1},
            {"name": site[0], "filename": site[1], "line": site[2]},
        ],
    }


def _nccl_dumps(folder: Path, as_json: bool) -> Path:
    """4 ranks: seq 1-4 completed everywhere; ranks 0-2 started all_reduce #5, rank 3 never
    entered it (it is still in its own step, recorded as nothing more)."""
    folder.mkdir()
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"}}
    for rank in range(4):
        entries = [_entry(k, "all_reduce", k + 1, "completed") for k in range(4)]
        if rank != 3:
            entries.append(_entry(4, "all_reduce", 5, "started", site=("sync_acks", "hi.py", 7)))
        dump = {"version": "2.8", "pg_config": config, "pg_status": {}, "entries": entries}
        path = folder / f"nccl_trace_rank_{rank}"
        path.write_bytes(json.dumps(dump).encode() if as_json else pickle.dumps(dump))
    return folder


def test_a_real_gloo_dump_names_the_rank_that_never_entered_the_collective():
    evidence = analyse(read_flight_dir(REAL))
    assert evidence.culprits == [2]
    text = "\n".join(evidence.notes + evidence.findings[0].evidence)
    assert "rebuilt from the ranks' own map" in text  # gloo's empty pg_config
    assert "never marks a collective completed" in text and "point-to-point" in text
    assert "rank 2: broadcast #4" in text and "all_reduce #4 at _rank (fr_capture.py" in text
    report = run_triage(TriageRequest(flight=(REAL,), logs=(REAL / "ranks.log",)))
    assert (report.kind, report.form, report.culprit.rank.label) == ("hang", "C", "PP0 TP2")


def test_two_ranks_that_disagree_name_no_culprit():
    evidence = analyse(read_flight_dir(TWO))
    assert evidence.culprits == [] and "no majority" in evidence.findings[0].evidence[0]
    report = run_triage(TriageRequest(flight=(TWO,)))
    assert report.kind == "unknown" and report.culprit is None
    assert any("rank 1: barrier #4" in e for e in report.evidence)


@pytest.mark.parametrize("as_json", [False, True], ids=["pickle", "json"])
def test_the_nccl_dump_shape_names_the_missing_rank(tmp_path, as_json):
    folder = _nccl_dumps(tmp_path / "fr", as_json)
    evidence = analyse(read_flight_dir(folder))
    assert evidence.culprits == [3]
    assert any("sync_acks (hi.py:7)" in e for e in evidence.findings[0].evidence)
    # With the logs' PP/TP, the global rank is placed (TP size 2: rank 3 is PP1 TP1).
    log = tmp_path / "server.log"
    log.write_text(
        "\n".join(
            f"[2026-06-24 15:00:0{k} PP{k // 2} TP{k % 2}] Scheduler watchdog timeout "
            "(self.watchdog_timeout=300)"
            for k in range(3)
        )
        + "\n"
    )
    report = run_triage(TriageRequest(flight=(folder,), logs=(log,)))
    assert (report.kind, report.culprit.rank.label) == ("hang", "PP1 TP1")


def test_a_dump_that_names_a_class_is_refused_not_run(tmp_path):
    folder = tmp_path / "fr"
    folder.mkdir()
    (folder / "trace_rank_0").write_bytes(pickle.dumps({"entries": [], "x": Path("/")}))
    with pytest.raises(UsageError, match="no Flight Recorder dump read"):
        read_flight_dir(folder)


def test_triage_fr_through_the_cli(tmp_path, capsys):
    from hicache_diag.cli.main import run_cli

    result = CliRunner().invoke(app, ["triage", "--json", "--fr", str(REAL)])
    data = json.loads(result.stdout)
    assert result.exit_code == 12 and data["culprit"]["label"] == "PP0 TP2"
    empty = tmp_path / "empty"
    empty.mkdir()
    for folder in (tmp_path / "missing", empty):
        assert run_cli(["triage", "--fr", str(folder)]) == 2
        err = capsys.readouterr().err.strip()
        assert "--fr" in err and len(err.splitlines()) == 1 and "Traceback" not in err
