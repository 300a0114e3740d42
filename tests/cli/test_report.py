import importlib.util
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hicache_diag.cli.main import app, run_cli

_spec = importlib.util.spec_from_file_location(
    "diag_builder", Path(__file__).parents[1] / "unit" / "diagnosis" / "builder.py"
)
builder = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(builder)


@pytest.fixture
def form_a_run(tmp_path):
    rd = builder.RunDir(tmp_path / "run")
    rd.set(1, 5, extend_num_tokens=12).crash(1, 5, builder.SHAPE_ERR, t=1000.05)
    rd.crash(0, 6, builder.PEER_ERR, t=1000.07, state="killed")
    return rd.write()


def test_report_renders_verdict_divergence_and_timelines(form_a_run):
    result = CliRunner().invoke(app, ["report", str(form_a_run)])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "crash (form A), exit 10" in out
    assert "first divergence: step 5, field extend_num_tokens" in out
    assert "per-rank timelines" in out and "host_free" in out
    assert "classified now" in out


def test_report_json_reemits_the_recorded_verdict(form_a_run, capsys):
    recorded = {"outcome": "hang", "form": "C", "failed_rank": 0, "evidence": ["recorded"]}
    (form_a_run / "verdict.json").write_text(json.dumps(recorded))
    assert run_cli(["report", str(form_a_run), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["schema"] == "hicache-diag/verdict/v1"
    assert (data["outcome"], data["form"], data["evidence"]) == ("hang", "C", ["recorded"])
    assert run_cli(["report", str(form_a_run), "--json", "--reclassify"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["outcome"], data["form"], data["failed_rank"]) == ("crash", "A", 1)


def test_report_plots_are_real_pngs_and_the_summary_links_them(form_a_run, tmp_path):
    plots = tmp_path / "plots"
    result = CliRunner().invoke(app, ["report", str(form_a_run), "--plots", str(plots)])
    assert result.exit_code == 0, result.output
    pngs = sorted(p.name for p in plots.glob("*.png"))
    assert pngs == [
        "acks_consumed.png",
        "extend_tokens.png",
        "host_free.png",
        "inflight_sends.png",
        "queues.png",
    ]
    for png in plots.glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    md = (plots / "report.md").read_text()
    assert "![queues](queues.png)" in md
    assert "| 5 | 16 | 12 |" in md  # the per-rank values at the divergence


def test_report_on_an_old_partial_run(tmp_path):
    rd = builder.RunDir(tmp_path / "old")
    rd.launcher = None
    rd.outputs = rd.reference = None
    rd.manifest.pop("evidence_version")
    root = rd.write()
    result = CliRunner().invoke(app, ["report", str(root)])
    # Nothing shows that the run finished: it cannot be called ok (exit 3, undecided).
    assert result.exit_code == 3, result.output
    assert "undecided" in result.output
    assert "missing: launcher.json" in result.output
    assert "note: evidence_version 0 (older than 1)" in result.output


@pytest.mark.parametrize("make", ["missing", "empty", "file"])
def test_report_bad_run_dir_is_one_line_exit_2(tmp_path, capsys, make):
    target = tmp_path / "x"
    if make == "empty":
        target.mkdir()
    elif make == "file":
        target.write_text("hi")
    assert run_cli(["report", str(target)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hicache-diag: error:")
    assert "Traceback" not in err[0]


SAMPLE_RUNS = sorted(
    p for p in (Path(__file__).parents[2] / "samples" / "runs").glob("*") if p.is_dir()
)


@pytest.mark.skipif(not SAMPLE_RUNS, reason="no committed sample runs yet")
@pytest.mark.parametrize("run_dir", SAMPLE_RUNS, ids=lambda p: p.name)
def test_report_renders_every_committed_sample_run(run_dir, tmp_path):
    plots = tmp_path / "plots"
    result = CliRunner().invoke(app, ["report", str(run_dir), "--plots", str(plots)])
    assert result.exit_code == 0, result.output
    assert "verdict:" in result.output
    assert list(plots.glob("*.png")) and (plots / "report.md").is_file()


def test_the_file_list_in_report_md_is_what_was_written(form_a_run, tmp_path):
    plots = tmp_path / "plots"
    assert run_cli(["report", str(form_a_run), "--plots", str(plots)]) == 0
    md = (plots / "report.md").read_text()
    listed = md.split("## Files\n", 1)[1].split()
    listed = sorted(item.split("](")[1].rstrip(")") for item in listed if item.startswith("["))
    assert listed == sorted(p.name for p in plots.iterdir())
    assert "report.html" in listed and "report.md" in listed


def test_a_second_report_into_the_same_folder_needs_force(form_a_run, tmp_path, capsys):
    plots = tmp_path / "plots"
    assert run_cli(["report", str(form_a_run), "--plots", str(plots)]) == 0
    before = {p.name: p.read_bytes() for p in plots.iterdir()}
    capsys.readouterr()
    assert run_cli(["report", str(form_a_run), "--plots", str(plots)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "already holds" in err[0] and "--force" in err[0]
    assert {p.name: p.read_bytes() for p in plots.iterdir()} == before
    assert run_cli(["report", str(form_a_run), "--plots", str(plots), "--force"]) == 0
    assert not list(plots.glob(".*")), "no temporary file left behind"


@pytest.mark.parametrize("name", ["rank0.jsonl", "rank1.log", "stacks/rank0.json"])
def test_a_rank_file_that_is_a_directory_is_one_line_exit_2(form_a_run, capsys, name):
    target = form_a_run / name
    if target.exists():
        target.unlink()
    target.mkdir(parents=True)
    (target / "x").write_text("a directory where a file belongs\n")
    assert run_cli(["report", str(form_a_run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{name} is damaged: it is not a regular file" in err[0], err


@pytest.mark.parametrize("run_dir", SAMPLE_RUNS, ids=lambda p: p.name)
def test_no_none_in_any_report_text(run_dir, tmp_path, capsys):
    summary = tmp_path / "report.md"
    assert run_cli(["report", str(run_dir), "--summary", str(summary)]) in (0, 3)
    assert "None" not in capsys.readouterr().out
    assert "None" not in summary.read_text()
