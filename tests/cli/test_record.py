"""`hicache-diag record` (issue 37): the user's own command exec'd in the CLI's place with the
recorder's environment, or that environment printed for a manifest; bad input is one line and
exit 2 before anything runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hicache_diag.cli.main import run_cli
from hicache_diag.evidence import recording as rec

SHOW = (
    "import json, os; print(json.dumps({'pid': os.getpid(), 'env': {k: v for k, v in "
    "os.environ.items() if k.startswith('HICACHE_DIAG_') or k == 'PYTHONPATH'}})); "
    "raise SystemExit(7)"
)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["record"], "record needs the command to run after `--` (or --print-env)"),
        (["record", "--json", "--", "true"], "--json goes with --print-env"),
        (["record", "--print-env", "--", "true"], "--print-env prints the environment"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, said, capsys):
    assert run_cli(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said in err[0]


def test_a_record_dir_that_is_a_file_is_refused(tmp_path, capsys):
    (tmp_path / "f").write_text("")
    assert run_cli(["record", "--dir", str(tmp_path / "f"), "--", "true"]) == 2
    assert "not a directory (it is a file)" in capsys.readouterr().err


def test_a_bundle_dir_holding_something_else_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HICACHE_DIAG_CACHE", str(tmp_path / "cache"))
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "mine.txt").write_text("")
    assert run_cli(["record", "--print-env", "--bundle-dir", str(tmp_path / "b")]) == 2
    assert "not empty and not a recorder bundle" in capsys.readouterr().err


def test_a_bundle_dir_that_is_a_symlink_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HICACHE_DIAG_CACHE", str(tmp_path / "cache"))
    (tmp_path / "mine").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "mine")
    assert run_cli(["record", "--print-env", "--bundle-dir", str(tmp_path / "link")]) == 2
    assert "a symlink; name the folder itself" in capsys.readouterr().err
    assert list((tmp_path / "mine").iterdir()) == []


def test_print_env_names_the_bundle_and_the_dir_and_nothing_else(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HICACHE_DIAG_CACHE", str(tmp_path / "cache"))
    bundle = tmp_path / "bundle"
    argv = ["record", "--print-env", "--dir", str(tmp_path / "rec"), "--bundle-dir", str(bundle)]
    assert run_cli(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        f'export PYTHONPATH={bundle}/site:{bundle}/lib"${{PYTHONPATH:+:$PYTHONPATH}}"',
        f"export HICACHE_DIAG_RECORD_DIR={tmp_path}/rec",
    ]
    assert (bundle / "site" / "sitecustomize.py").is_file()
    assert (bundle / "lib" / "hicache_diag" / "engines" / "sglang" / "plugin" / "boot.py").is_file()
    assert run_cli([*argv, "--json", "--cpu-shims"]) == 0  # a second copy replaces the first
    manifest = json.loads(capsys.readouterr().out)
    assert manifest["env"] == {
        "PYTHONPATH": f"{bundle}/site:{bundle}/lib",
        rec.RECORD_DIR_ENV: f"{tmp_path}/rec",
        rec.CPU_SHIMS_ENV: "1",
    }
    assert manifest["env_list"][0] == {"name": "PYTHONPATH", "value": f"{bundle}/site:{bundle}/lib"}
    assert manifest["dump_signal"] == "SIGUSR2" and manifest["dump_request"] == "dump-request.json"


def _base() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("HICACHE_DIAG_")}


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hicache_diag.cli.main", *args],
        capture_output=True,
        text=True,
        env=_base() if env is None else env,
        timeout=120,
        check=False,
    )


@pytest.mark.process
def test_the_command_replaces_the_cli_with_the_recorders_environment(tmp_path):
    env = {**_base(), "HICACHE_DIAG_CACHE": str(tmp_path / "cache"), "PYTHONPATH": "/theirs"}
    done = _cli("record", "--dir", str(tmp_path / "rec"), "--", sys.executable, "-c", SHOW, env=env)
    assert done.returncode == 7, done.stderr  # the command's own exit code
    seen = json.loads(done.stdout)
    session = seen["env"].pop(rec.SESSION_ENV)
    assert session.endswith(f"-{seen['pid']}")  # named by the launch's first process: itself
    bundle = tmp_path / "cache" / "plugin"
    (root,) = bundle.iterdir()
    assert seen["env"] == {
        "PYTHONPATH": f"{root}/site:{root}/lib:/theirs",
        rec.RECORD_DIR_ENV: str(tmp_path / "rec"),
        "HICACHE_DIAG_CACHE": str(tmp_path / "cache"),
    }
    assert (tmp_path / "rec").is_dir() and (tmp_path / "rec").stat().st_mode & 0o777 == 0o700


@pytest.mark.process
def test_the_switch_off_runs_the_command_as_it_is(tmp_path):
    env = {**_base(), "HICACHE_DIAG_CACHE": str(tmp_path / "c"), rec.SWITCH_ENV: "OFF"}
    env.pop("PYTHONPATH", None)
    done = _cli("record", "--dir", str(tmp_path / "rec"), "--", sys.executable, "-c", SHOW, env=env)
    assert done.returncode == 7 and "running the command without the recorder" in done.stderr
    assert json.loads(done.stdout)["env"] == {
        rec.SWITCH_ENV: "OFF",
        "HICACHE_DIAG_CACHE": str(tmp_path / "c"),
    }


@pytest.mark.process
def test_the_switch_off_keeps_the_cpu_shims_asked_for(tmp_path):
    """A CPU host needs the shims to serve at all: off means no recording, not no shims."""
    env = {**_base(), "HICACHE_DIAG_CACHE": str(tmp_path / "c"), rec.SWITCH_ENV: "0"}
    argv = ["record", "--cpu-shims", "--dir", str(tmp_path / "rec"), "--", sys.executable]
    done = _cli(*argv, "-c", SHOW, env=env)
    assert done.returncode == 7 and "with the CPU shims alone" in done.stderr
    seen = json.loads(done.stdout)["env"]
    assert seen[rec.CPU_SHIMS_ENV] == "1" and seen[rec.SWITCH_ENV] == "0"
    assert rec.SESSION_ENV not in seen and not (tmp_path / "rec").exists()


@pytest.mark.process
def test_a_switch_neither_on_nor_off_is_refused(tmp_path):
    env = {**_base(), rec.SWITCH_ENV: "maybe"}
    done = _cli("record", "--dir", str(tmp_path), "--", "true", env=env)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "hicache-diag: error: HICACHE_DIAG_RECORD='maybe' (whether ranks record their steps) "
        "must be one of 1, on, true, yes, 0, off, false, no"
    ]


@pytest.mark.process
def test_a_command_that_cannot_run_is_one_line(tmp_path):
    done = _cli("record", "--dir", str(tmp_path), "--", str(tmp_path / "nope"))
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"hicache-diag: error: cannot run '{tmp_path / 'nope'}': No such file or directory"
    )


@pytest.mark.process
def test_the_copied_bundle_imports_with_nothing_installed(tmp_path):
    """A manifest's image has no hicache-diag: the copied folder alone holds the recorder."""
    env = {**_base(), "HICACHE_DIAG_CACHE": str(tmp_path / "cache")}
    done = _cli("record", "--print-env", "--bundle-dir", str(tmp_path / "b"), env=env)
    assert done.returncode == 0, done.stderr
    code = (
        "import hicache_diag.engines.sglang.plugin.boot as b, "
        "hicache_diag.engines.sglang.plugin.production, hicache_diag.evidence.recording; "
        "print(b.__file__)"
    )
    lib = Path(tmp_path / "b" / "lib")
    run = subprocess.run(
        [sys.executable, "-S", "-c", code],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(lib)},
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().startswith(str(lib))
