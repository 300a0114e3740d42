"""The table of malformed inputs: each is one line on stderr and exit 2 (or 3), and nothing is
started or written. bench/bad_input.py runs the same table as subprocesses and times it."""

from __future__ import annotations

import pytest

from hicache_diag.cli.main import run_cli
from tests.cli.bad_inputs import ALL_CASES, PROBE_CASES, expand, make_files
from tests.conftest import live_children


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    path = tmp_path_factory.mktemp("bad-input")
    make_files(path)
    return path


@pytest.mark.parametrize(
    ("argv", "code", "needle"),
    ALL_CASES,
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_bad_input_is_one_line_before_anything_starts(
    capsys, monkeypatch, tmp_path, root, argv, code, needle
):
    monkeypatch.chdir(tmp_path)  # a default run dir would appear here as runs/
    rc = run_cli(expand(argv, root))
    err = capsys.readouterr().err
    assert rc == code, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hicache-diag: error:"), err
    assert needle in lines[0], lines[0]
    assert "ptrace" not in lines[0]
    assert not (tmp_path / "runs").exists(), "bad input must not create a run directory"
    assert not live_children(), "bad input must not start a rank"
    assert sorted(p.name for p in (root / "nonempty").iterdir()) == ["old.txt"]


@pytest.mark.process
@pytest.mark.parametrize(
    ("argv", "code", "needle"),
    PROBE_CASES,
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_bad_release_is_one_line_before_anything_starts(tmp_path, root, argv, code, needle):
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "hicache_diag.cli.main", *expand(argv, root)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == code and len(lines) == 1 and needle in lines[0], proc.stderr
    assert not (tmp_path / "runs").exists(), "refused before any run dir or trial"


@pytest.mark.process
def test_triage_of_a_non_python_pid_as_root_does_not_blame_ptrace(capsys):
    import os

    if os.geteuid() != 0:
        pytest.skip("the root case: without root, ptrace is the right hint")
    rc = run_cli(["triage", "--pid", "1", "--json", "--samples", "1"])
    out = capsys.readouterr().out
    assert rc in (2, 3)
    assert "ptrace" not in out, out
