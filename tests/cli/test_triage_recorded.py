"""`hicache-diag triage` on a production recording through the CLI: offline (`--record-dir`, a
session or its record dir), the JSON schema in docs/triage.md, bad input; and live on real
processes that record and answer dump requests as a recorded server's schedulers do, with
ptrace refused (tests/unit/triage/no_ptrace.py) and one rank SIGSTOPped."""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hicache_diag.cli.main import app, run_cli
from hicache_diag.evidence import recording as rec
from tests.unit.triage.recorded_ranks import RecordedRanks
from tests.unit.triage.recordings import record, small

jsonschema = pytest.importorskip("jsonschema")  # in the [test] extra

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "samples" / "runs" / "sglang-0.5.23-session-close"
HERE = ROOT / "tests" / "unit" / "triage"
runner = CliRunner()


def _schema() -> dict:
    text = (ROOT / "docs" / "triage.md").read_text()
    block = text.split("<!-- schema: hicache-diag/triage/v1 -->", 1)[1]
    return json.loads(block.split("```json", 1)[1].split("```", 1)[0])


def _triage(*args: str) -> tuple[int, dict]:
    result = runner.invoke(app, ["triage", *args, "--json"])
    return result.exit_code, json.loads(result.stdout)


def _record_run(session: Path) -> None:
    """The committed SGLang 0.5.23 session-close run's step lines, through the recorder's
    writer: the recording a `hicache-diag record` launch of that run would have left."""
    fields = ["rids", "extend_num_tokens", "prefix_len", "acks_consumed", "evicted", "tree_digest"]
    for r in (0, 1):
        meta = rec.RankMeta(r, r, 0, 100 + r, "h", "0.5.23", fields, 0.0, {})
        writer = rec.RankRecording(session, meta, small())
        for raw in (RUN / f"rank{r}.jsonl").read_text().splitlines():
            writer.write_step(json.loads(raw))
        writer.close()


def test_a_copied_recording_gives_the_crash_its_form_and_the_first_divergence(tmp_path):
    _record_run(tmp_path / "host-20260101T000000Z-1")
    code, data = _triage("--record-dir", str(tmp_path))  # the record dir: its newest session
    jsonschema.validate(data, _schema())
    assert (code, data["kind"], data["form"]) == (10, "crash", "A")
    assert data["culprit"]["label"] == "PP1 TP0"  # the rank that raised, from its crash record
    first = data["first_divergence"]
    assert (first["step"], first["field"], first["source"]) == (384, "evicted", "session-clock")
    assert first["values"] == {"0": 96, "1": 0} and first["reach"] == "lines"
    assert [(r["label"], r["last_step"], r["blind"]) for r in data["recorded"]] == [
        ("PP0 TP0", 385, None),
        ("PP1 TP0", 384, None),
    ]


def test_the_text_panel_shows_the_recorded_ranks_and_the_first_divergence(tmp_path):
    _record_run(tmp_path)
    result = runner.invoke(app, ["triage", "--record-dir", str(tmp_path)], terminal_width=120)
    assert result.exit_code == 10, result.output
    assert "recorded" in result.output
    assert "first divergence: step 384, evicted: rank 0 = 96, rank 1 = 0" in result.output
    assert "source session-clock" in result.output


def test_values_rotated_out_say_so_in_json(tmp_path):
    def change(step: int, rank: int) -> dict:
        return {"evicted": 3} if (step == 30 and rank == 1) else {}

    record(tmp_path, 2, 200, change, small(lines_bytes=2000))
    code, data = _triage("--record-dir", str(tmp_path))
    jsonschema.validate(data, _schema())
    first = data["first_divergence"]
    assert (first["step"], first["field"], first["reach"]) == (30, "evicted", "digests")
    assert first["source"] == "unknown" and first["values"]["0"].startswith("crc32:")


def test_every_triage_output_matches_the_documented_schema():
    for args in (
        ["--dumps", str(ROOT / "samples" / "dumps" / "pp_hang_pp_sync")],
        ["--logs", str(ROOT / "samples" / "logs" / "form_a_cascade.log")],
    ):
        _, data = _triage(*args)
        jsonschema.validate(data, _schema())
        assert data["recorded"] is None and data["first_divergence"] is None


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p / "nope", "does not exist"),
        (lambda p: p, "no recording in it"),
        (lambda p: (p / "f").write_text("x") and p / "f", "give a directory"),
    ],
)
def test_a_bad_record_dir_is_one_line_exit_2(tmp_path, capsys, make, message):
    path = make(tmp_path)
    assert run_cli(["triage", "--record-dir", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_record_dir_is_not_for_the_nodes_path(tmp_path, capsys):
    assert run_cli(["triage", "--live", "--record-dir", str(tmp_path)]) == 2
    assert "--record-dir" in capsys.readouterr().err


# -- live: real processes that record and answer dump requests ---------------------------------


def _live(pids: list[int], *, refuse_ptrace: bool) -> tuple[int, dict]:
    cmd = [sys.executable, "-m", "hicache_diag.cli.main", "triage", "--json"]
    cmd += [a for pid in pids for a in ("--pid", str(pid))]
    if refuse_ptrace:
        cmd = [sys.executable, str(HERE / "no_ptrace.py"), *cmd]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    return proc.returncode, json.loads(proc.stdout)


needs_seccomp = pytest.mark.skipif(
    platform.machine() != "x86_64", reason="no_ptrace.py filters x86_64's syscalls only"
)


@pytest.mark.process
@needs_seccomp
def test_live_with_ptrace_refused_judges_the_in_process_dumps(tmp_path):
    with RecordedRanks(tmp_path / "s", (100, 100), part=30) as ranks:
        code, data = _live(ranks.pids, refuse_ptrace=True)
    jsonschema.validate(data, _schema())
    text = "\n".join(data["evidence"])
    assert "ptrace denied" in text and "in-process dumps" in text  # py-spy was refused
    assert [r["wait_site"] for r in data["ranks"]] == ["pp-proxy-recv", "pp-proxy-recv"]
    assert all(r["progressed"] is False for r in data["ranks"])  # two dumps each, compared
    first = data["first_divergence"]
    assert (first["step"], first["field"], first["values"]) == (30, "extend_num_tokens", {
        "0": 8,
        "1": 5,
    })  # fmt: skip
    assert all(r["blind"] is None and r["dumped_at"] for r in data["recorded"])
    assert code == 12


@pytest.mark.process
@needs_seccomp
def test_a_stopped_rank_is_named_from_its_peers_dumps_its_last_step_and_its_state(tmp_path):
    with RecordedRanks(tmp_path / "s", (100, 90), part=-1) as ranks:
        os.kill(ranks.pids[1], signal.SIGSTOP)
        code, data = _live(ranks.pids, refuse_ptrace=True)
    jsonschema.validate(data, _schema())
    assert (code, data["kind"], data["cause"]) == (12, "hang", "straggler")
    assert data["culprit"]["label"] == "PP1 TP0"
    text = "\n".join(data["evidence"])
    assert "PP1 TP0 is stopped (kernel state T" in text
    assert "PP1 TP0's last recorded step is 90, 10 step(s) behind its peers' (100)" in text
    by_label = {r["label"]: r for r in data["recorded"]}
    assert by_label["PP1 TP0"]["blind"].startswith("no answer: its process is stopped")
    assert by_label["PP0 TP0"]["blind"] is None
    [peer] = [r for r in data["ranks"] if r["label"] == "PP0 TP0"]
    assert peer["wait_site"] == "pp-proxy-recv"  # from its in-process dump: py-spy was refused
    assert data["first_divergence"] is None


@pytest.mark.process
def test_a_live_rank_whose_recording_could_not_start_is_blind_not_guessed(tmp_path):
    """Its environment names a session its recorder could not create (here a file stands where
    the folder would go: what a read-only or full disk does to the recorder)."""
    (tmp_path / "file").write_text("")
    with RecordedRanks(tmp_path / "file" / "s", (10, 10), part=-1) as ranks:
        code, data = _live(ranks.pids, refuse_ptrace=False)
    jsonschema.validate(data, _schema())
    assert [r["blind"][:8] for r in data["recorded"]] == ["missing:", "missing:"]
    assert "holds no file of it" in data["recorded"][0]["blind"]
    assert data["first_divergence"] is None and code in (0, 3, 12)
