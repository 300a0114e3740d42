"""Every environment variable the tool reads is checked when a command starts (one table)."""

from __future__ import annotations

import pytest

from hicache_diag.cli.main import run_cli
from hicache_diag.errors import UsageError
from hicache_diag.options.env_vars import (
    ENV_VARS,
    INTERNAL,
    TESTS_ONLY,
    check_environment,
    environment_warnings,
    switch_on,
)


@pytest.mark.parametrize(
    ("name", "value", "needle"),
    [
        ("HICACHE_DIAG_RANK_START", "thread", "must be one of fork, spawn"),
        ("HICACHE_DIAG_TRIAL_START", "warm", "must be one of fork, spawn"),
        ("HICACHE_DIAG_RECORD", "maybe", "must be one of 1, on, true, yes, 0, off, false, no"),
        ("HICACHE_DIAG_SGLANG_READY_TIMEOUT", "abc", "a number of seconds > 0"),
        ("HICACHE_DIAG_SGLANG_READY_TIMEOUT", "-5", "a number of seconds > 0"),
        ("HICACHE_DIAG_SGLANG_READY_TIMEOUT", "inf", "a number of seconds > 0"),
    ],
)
def test_an_unusable_value_is_named_with_what_it_takes(name, value, needle):
    with pytest.raises(UsageError) as err:
        check_environment({name: value})
    assert str(err.value).startswith(f"{name}={value!r}") and needle in str(err.value)


def test_usable_values_and_unset_pass(tmp_path):
    check_environment({})
    check_environment(
        {
            "HICACHE_DIAG_RANK_START": "spawn",
            "HICACHE_DIAG_RECORD": "off",
            "HICACHE_DIAG_SGLANG_READY_TIMEOUT": "600",
            "HICACHE_DIAG_CACHE": str(tmp_path / "new"),
            "HICACHE_DIAG_SGLANG_VENVS": "",
        }
    )
    assert switch_on("off") is False and switch_on(None) is True


def test_a_file_where_a_directory_is_read_is_refused(tmp_path):
    path = tmp_path / "f"
    path.write_text("")
    with pytest.raises(UsageError, match="must be a directory"):
        check_environment({"HICACHE_DIAG_CACHE": str(path)})


def test_the_cli_refuses_before_any_work(monkeypatch, capsys):
    monkeypatch.setenv("HICACHE_DIAG_TRIAL_START", "warm")
    assert run_cli(["run", "--requests", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "hicache-diag: error: HICACHE_DIAG_TRIAL_START='warm' (how bisect trials start) "
        "must be one of fork, spawn"
    ]


def test_the_table_names_each_variable_the_code_reads():
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[2]
    read = set()
    for path in [*root.glob("hicache_diag/**/*.py"), *root.glob("cli/**/*.py")]:
        if "sglang_plugin" in path.parts:  # runs inside SGLang; reads SGLang's own variables
            continue
        read |= set(re.findall(r'"(HICACHE_DIAG_[A-Z_]+)"', path.read_text()))
    internal = set(INTERNAL) | set(TESTS_ONLY)  # set by us for ranks, or read by tests only
    assert read - internal <= {v.name for v in ENV_VARS}, (
        read - internal - {v.name for v in ENV_VARS}
    )


def test_a_variable_the_tool_does_not_read_is_named_in_a_warning():
    said = environment_warnings(
        {"HICACHE_DIAG_RANKSTART": "spawn", "HICACHE_DIAG_RANK": "1", "HICACHE_DIAG_CACHE": "/x"}
    )
    assert said == [
        "HICACHE_DIAG_RANK is set by hicache-diag for its own processes; ignored here",
        "HICACHE_DIAG_RANKSTART is not a variable hicache-diag reads; ignored",
    ]


@pytest.mark.parametrize(
    ("name", "value", "good"),
    [("SLURM_JOB_ID", "garbage", "12345"), ("SLURM_JOB_ID", "1.5", "77_3")],
)
def test_slurm_job_id_is_checked(name, value, good):
    check_environment({name: good})
    with pytest.raises(UsageError, match="must be a Slurm job id"):
        check_environment({name: value})
