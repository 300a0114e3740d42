"""`hicache-diag run --list-faults` prints the catalog and exits 0, found from `run --help`;
with --engine, only the faults that engine can run (other run flags warn: test_odd_inputs.py)."""

from typer.testing import CliRunner

from hicache_diag.cli.main import app, run_cli
from hicache_diag.faults import FAULTS
from hicache_diag.faults.catalog import catalog_text


def test_list_faults_prints_every_fault_and_exits_0():
    result = CliRunner().invoke(app, ["run", "--list-faults"])
    assert result.exit_code == 0, result.output
    assert result.stdout == catalog_text()
    for name in FAULTS:
        assert f"\n{name}  (keys:" in "\n" + result.stdout


def test_engine_keeps_the_faults_it_can_run(capsys):
    assert run_cli(["run", "--engine", "builtin", "--list-faults"]) == 0
    out, err = capsys.readouterr()
    kept = [n for n in FAULTS if not FAULTS[n].BUILTIN_REFUSAL]
    assert out == catalog_text(kept) and "rank-stall" in kept and not err
    assert "flush-clock  (keys:" not in out
    # SGLang refuses per release, at its probe: before one is named, every fault.
    assert run_cli(["run", "--list-faults", "--engine", "sglang"]) == 0
    assert capsys.readouterr().out == catalog_text()


def test_an_unknown_engine_is_bad_input(capsys):
    assert run_cli(["run", "--engine", "nope", "--list-faults"]) == 2
    assert "valid: builtin, sglang" in capsys.readouterr().err


def test_run_help_names_list_faults():
    result = CliRunner().invoke(app, ["run", "--help"])
    assert result.exit_code == 0
    assert "--list-faults" in result.stdout
