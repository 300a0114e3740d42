"""Options declared once (issue 40): `run`'s flags are made from the run options' fields, help
comes in panels, an old spelling still works and says so, and a check table reads an option by
its declaration (a flag a command lacks is an error, never a rule silently off)."""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from hicache_diag.cli.main import app, run_cli
from hicache_diag.cli.params import Parsed
from hicache_diag.cli.run_flags import run_fields
from hicache_diag.options.params import Param


def _help(*args: str) -> str:
    res = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    return res.output


def test_each_run_flag_is_one_field_and_every_spelling_is_one_option():
    spellings = [s for _, p, _ in run_fields() for s in p.spellings]
    assert len(spellings) == len(set(spellings)), spellings
    run = typer.main.get_command(app).commands["run"]  # type: ignore[attr-defined]
    opts = {o for p in run.params for o in getattr(p, "opts", ())}
    assert set(spellings) <= opts
    names = {p.name for p in run.params}
    assert {f.name for f, _, _ in run_fields()} <= names  # the click name is the field's


def test_run_help_is_in_panels_with_every_default_shown():
    text = _help("run")
    heads = [ln for ln in text.splitlines() if ln and not ln.startswith(" ")]
    panels = [h for h in heads if h.endswith(":") and not h.startswith("Usage")]
    assert panels[:3] == [
        "Common:",
        "Faults:",
        "Cache (device pool, HiCache host pool and L3 storage):",
    ]
    assert any(p.startswith("builtin engine:") for p in panels)
    assert any(p.startswith("sglang engine:") for p in panels)
    assert "Output:" in panels
    assert "[default: ]" not in text and "[default: None]" not in text
    block = text.split("--engine NAME", 1)[1].split("\n  --", 1)[0]
    assert "[default: builtin]" in " ".join(block.split())


def test_run_help_for_one_engine_shows_its_own_panel_only():
    text = _help("run", "--engine", "sglang")
    assert "sglang engine:" in text and "builtin engine:" not in text
    assert "--sglang-python" in text and "--max-steps" not in text


@pytest.mark.parametrize("command", ["run", "bisect", "triage", "hunt", "shrink"])
def test_no_completion_flags(command):
    assert "completion" not in _help(command)


@pytest.mark.parametrize(
    ("argv", "old", "new"),
    [
        (["run", "--fix", "ack-count=leader", "--pp", "0"], "--fix", "--switch"),
        (["triage", "--pp-size", "0", "--logs", "{log}"], "--pp-size", "--pp"),
    ],
)
def test_an_old_spelling_still_works_and_warns_once(argv, old, new, tmp_path, capsys):
    log = tmp_path / "s.log"
    log.write_text("hello\n")
    assert run_cli([a.replace("{log}", str(log)) for a in argv]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0] == f"hicache-diag: warning: {old} is deprecated: use {new}"
    assert len(lines) == 2 and lines[1].startswith("hicache-diag: error:")
    assert re.search(r"(--pp must|must be positive)", lines[1]), lines  # the value was read
    assert old not in _help(argv[0])  # hidden


def test_a_check_that_names_a_flag_its_command_lacks_is_an_error():
    run = typer.main.get_command(app).commands["run"]  # type: ignore[attr-defined]
    ctx = run.make_context("run", ["--pp", "3"])
    parsed = Parsed(ctx)
    assert parsed.given(Param("--pp", "")) and parsed.value(Param("--pp", "")) == 3
    with pytest.raises(KeyError, match="has no option --no-such-flag"):
        parsed.given(Param("--no-such-flag", ""))


def test_bisect_switch_of_one_value_is_a_setting_of_every_cell(tmp_path):
    from hicache_diag.cli.bisect import BisectRequest, plan_bisect

    req = BisectRequest(
        ["--protocol", "legacy"],
        "none,file",
        None,
        ("ack-count=leader",),
        1,
        1,
        0,
        str(tmp_path / "b"),
        None,
        None,
        None,
    )
    cfg, _ = plan_bisect(req, quiet=True)
    assert [a.name for a in cfg.axes] == ["storage-backend"]
    assert [c.protocol.mode("ack-count") for c in cfg.cells] == ["leader", "leader"]
    assert cfg.run_args[-2:] == ("--switch", "ack-count=leader")  # each trial's line says so
