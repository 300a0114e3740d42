"""`hicache-diag run --list-faults` prints the catalog and exits 0, found from `run --help`."""

from typer.testing import CliRunner

from hicache_diag.cli.main import app
from hicache_diag.faults import FAULTS
from hicache_diag.faults.catalog import catalog_text


def test_list_faults_prints_every_fault_and_exits_0():
    result = CliRunner().invoke(app, ["run", "--list-faults"])
    assert result.exit_code == 0, result.output
    assert result.stdout == catalog_text()
    for name in FAULTS:
        assert f"\n{name}  (keys:" in "\n" + result.stdout


def test_run_help_names_list_faults():
    result = CliRunner().invoke(app, ["run", "--help"])
    assert result.exit_code == 0
    assert "--list-faults" in result.stdout
