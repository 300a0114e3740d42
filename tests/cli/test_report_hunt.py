"""`hicache-diag report HUNT_DIR`: a committed hunt re-judged from its own runs (files only),
its save (hunt.json's first divergences and table.txt, nothing else), and run dirs that are
not here any more."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from hicache_diag.cli.main import run_cli
from hicache_diag.cli.render.hunt import hunt_table
from hicache_diag.hunt.model import HuntReport
from hicache_diag.hunt.rejudge import locate_run, rejudge_hunt

ROOT = Path(__file__).resolve().parents[2]
SESSIONS = Path("samples") / "hunt" / "sglang-0.5.23-sessions"
FIRST = Path("samples") / "hunt" / "sglang-0.5.23"
CLOSE = {"step": 2383, "field": "evicted", "values": {"0": 0, "1": 96}, "source": "session-clock"}
TIMEOUT = {
    "step": 2568,
    "field": "rids",
    "values": {"0": ["s000-t2"], "1": []},
    "source": "session-clock",
}


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def moved_sessions(tmp_path, monkeypatch) -> Path:
    """The sessions hunt as the hunt wrote it (no first divergence: the finder did not yet
    read folded idle slots), copied into another checkout and run from a folder outside it:
    its repo-relative run dirs are found from the hunt dir's parents, not from the cwd."""
    hunt = tmp_path / "repo" / SESSIONS
    shutil.copytree(ROOT / SESSIONS, hunt)
    data = json.loads((hunt / "hunt.json").read_text())
    for entry in data["results"]:
        entry["first_divergence"] = entry["via"] = None
    (hunt / "hunt.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    (hunt / "table.txt").write_text("session-close: no first divergence recorded\n")
    monkeypatch.chdir(tmp_path)
    return hunt


def test_a_hunt_dir_is_rejudged_from_its_runs_and_nothing_is_written(capsys, monkeypatch):
    """The committed samples were refreshed with `report --save --force`: their runs,
    judged again, say what hunt.json says (a finder change that alters it fails here)."""
    monkeypatch.chdir(ROOT)
    before = _snapshot(ROOT / SESSIONS)
    assert run_cli(["report", str(SESSIONS)]) == 0
    out = capsys.readouterr().out
    assert "session-close: first divergence at step 2383, evicted: rank 0: 0, rank 1: 96" in out
    assert "session-timeout: first divergence at step 2568, rids" in out
    assert "DIVERGES via session-clock (confirmed)" in out
    assert out.count("re-judged from its run: as recorded") == 2
    assert "no first divergence recorded" not in out
    assert _snapshot(ROOT / SESSIONS) == before


def test_the_json_is_the_hunt_report_with_the_fresh_first_divergences(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert run_cli(["report", str(SESSIONS), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["schema"] == "hicache-diag/hunt/v1"
    fresh = {r["trigger"]: (r["first_divergence"], r["via"]) for r in data["results"]}
    assert fresh == {
        "session-close": (CLOSE, "session-clock"),
        "session-timeout": (TIMEOUT, "session-clock"),
    }


def test_an_older_hunt_keeps_its_recorded_confirmation_and_names_each_source(capsys, monkeypatch):
    """The first 0.5.23 hunt predates `reruns`: its unconfirmed rows say what it said then;
    host-pool's run names no divergence (PP1 raised inside its step), flush-deadline's as
    recorded."""
    monkeypatch.chdir(ROOT)
    assert run_cli(["report", str(FIRST)]) == 0
    out = capsys.readouterr().out
    assert out.count("failed via session-clock, not") == 2  # the column wraps the rest
    wide = Console(file=io.StringIO(), width=300)
    wide.print(hunt_table(rejudge_hunt(FIRST).report))
    assert wide.file.getvalue().count("failed via session-clock, not confirmed on a fresh") == 2
    assert "session-close: first divergence at step 641, evicted" in out
    assert "session-timeout: first divergence at step 421, evicted" in out
    assert "host-pool: no first divergence recorded" in out
    assert "step 510, host_free: rank 0: 364, rank 1: 516 (source flush-deadline)" in out
    assert out.count("re-judged from its run: as recorded") == 4


def test_save_needs_force_then_rewrites_only_the_first_divergences(moved_sessions, capsys):
    hunt = moved_sessions
    before = _snapshot(hunt)
    assert run_cli(["report", str(hunt), "--save"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "add --force" in err[0], err
    assert _snapshot(hunt) == before

    recorded = json.loads((hunt / "hunt.json").read_text())
    assert run_cli(["report", str(hunt)]) == 0
    out = capsys.readouterr().out
    assert out.count("re-judged from its run; recorded by the hunt: none") == 2
    assert "2 first divergence(s) differ from hunt.json" in out
    assert run_cli(["report", str(hunt), "--save", "--force"]) == 0
    err = capsys.readouterr().err
    assert f"wrote {hunt / 'hunt.json'}" in err and f"wrote {hunt / 'table.txt'}" in err
    assert "session-close: first_divergence none -> step 2383 evicted (session-clock)" in err
    saved = json.loads((hunt / "hunt.json").read_text())
    for old, new in zip(recorded["results"], saved["results"], strict=True):
        changed = {k for k in old.keys() | new.keys() if old.get(k) != new.get(k)}
        assert changed == {"first_divergence", "via"}
    assert {k: v for k, v in saved.items() if k != "results"} == {
        k: v for k, v in recorded.items() if k != "results"
    }
    assert saved["results"][0]["first_divergence"] == CLOSE
    assert saved == json.loads((ROOT / SESSIONS / "hunt.json").read_text())  # the refresh
    table = (hunt / "table.txt").read_text()
    assert "step 2383, evicted" in table and "no first divergence recorded" not in table
    assert table == (ROOT / SESSIONS / "table.txt").read_text()
    assert "\x1b[" not in table  # plain text
    assert not list(hunt.glob(".*.tmp"))  # atomic writes leave no temporary file

    assert run_cli(["report", str(hunt), "--save", "--force"]) == 0
    err = capsys.readouterr().err
    assert "hunt.json: unchanged" in err and "table.txt: unchanged" in err


def test_run_dirs_not_here_keep_their_recorded_entries(tmp_path, capsys, monkeypatch):
    """hunt.json as the hunt wrote it on another machine (absolute paths gone) beside one
    whose runs were copied away: each trigger says so, and a save keeps the entry."""
    monkeypatch.chdir(tmp_path)
    data = json.loads((ROOT / SESSIONS / "hunt.json").read_text())
    data["results"][0]["first_failure"] = "/gone/h0523-sc2/session-close/variant0/trial1-seed1"
    data["results"][0]["first_divergence"] = {"step": 7, "field": "rids", "source": "unknown"}
    data["results"][1]["first_failure"] = "runs/nowhere/session-timeout"
    hunt = tmp_path / "hunt"
    hunt.mkdir()
    (hunt / "hunt.json").write_text(json.dumps(data))
    assert run_cli(["report", str(hunt), "--save", "--force"]) == 0
    captured = capsys.readouterr()
    assert captured.out.count("is not here: the recorded first divergence is kept") == 2
    assert "session-close: first divergence at step 7, rids" in captured.out
    assert f"{hunt / 'hunt.json'}: unchanged" in captured.err
    assert json.loads((hunt / "hunt.json").read_text()) == data


def test_a_first_failure_the_classifier_now_passes_says_so(tmp_path, capsys):
    data = json.loads((ROOT / SESSIONS / "hunt.json").read_text())
    data["results"] = data["results"][:1]
    data["results"][0]["first_failure"] = str(ROOT / "samples" / "runs" / "healthy")
    (tmp_path / "hunt.json").write_text(json.dumps(data))
    assert run_cli(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "its run now classifies as ok, not a failure" in out
    assert "session-close: no first divergence recorded" in out


@pytest.mark.parametrize(
    ("key", "value"), [("forms", ["A"]), ("trials", "4"), ("interval", [0.1]), ("trials", True)]
)
def test_a_result_the_hunt_would_not_write_is_one_line_exit_2(tmp_path, capsys, key, value):
    data = json.loads((ROOT / SESSIONS / "hunt.json").read_text())
    data["results"][1][key] = value
    (tmp_path / "hunt.json").write_text(json.dumps(data))
    assert run_cli(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "hunt.json is damaged: session-timeout:" in err[0], err


def test_a_moved_hunt_finds_an_absolute_run_dir_by_its_trigger_tail(tmp_path):
    run = tmp_path / "h" / "session-close" / "variant0" / "cell0-base" / "trial1-seed1"
    shutil.copytree(ROOT / SESSIONS / "runs" / "session-close", run)
    gone = "/work/hunts/h0523-sc2/session-close/variant0/cell0-base/trial1-seed1"
    assert locate_run(gone, "session-close", tmp_path / "h") == run
    assert locate_run(gone, "session-timeout", tmp_path / "h") is None


def test_hunt_json_round_trips_through_the_model():
    raw = json.loads((ROOT / SESSIONS / "hunt.json").read_text())
    assert HuntReport.from_json(raw).to_json() == raw


def test_reclassify_on_a_hunt_dir_is_refused_in_one_line_and_writes_nothing(
    tmp_path, capsys, monkeypatch
):
    """The hunt's report already classifies each first failing run afresh; re-tallying every
    trial would leave its confirmations and export on a run that may no longer be the first."""
    hunt = tmp_path / "repo" / SESSIONS
    shutil.copytree(ROOT / SESSIONS, hunt)
    before = _snapshot(hunt)
    monkeypatch.chdir(tmp_path)
    assert run_cli(["report", str(hunt), "--reclassify"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "--reclassify" in lines[0], captured.err
    assert "classifies each trigger's first failing run afresh" in lines[0]
    assert run_cli(["report", str(hunt), "--reclassify", "--save", "--force"]) == 2
    assert _snapshot(hunt) == before
