"""Launcher start method: $HICACHE_DIAG_RANK_START, fork by default, a bad value exits 2."""

from __future__ import annotations

import pytest

from hicache_diag.cli.main import run_cli
from hicache_diag.engines.builtin.launcher import START_METHOD_ENV, start_method_from_env
from hicache_diag.engines.builtin.rank_main import RANK_PRELOAD
from hicache_diag.errors import UsageError
from hicache_diag.trials.forked_process import preload


def test_fork_is_the_default(monkeypatch):
    monkeypatch.delenv(START_METHOD_ENV, raising=False)
    assert start_method_from_env() == "fork"
    monkeypatch.setenv(START_METHOD_ENV, "")
    assert start_method_from_env() == "fork"


def test_spawn_is_selectable(monkeypatch):
    monkeypatch.setenv(START_METHOD_ENV, "spawn")
    assert start_method_from_env() == "spawn"


def test_unknown_method_names_the_choices(monkeypatch):
    monkeypatch.setenv(START_METHOD_ENV, "forkserver")
    with pytest.raises(UsageError, match="'forkserver' is not one of fork, spawn"):
        start_method_from_env()


def test_unknown_method_is_exit_2_with_one_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv(START_METHOD_ENV, "zygote")
    assert run_cli(["run", "--requests", "2", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and START_METHOD_ENV in err[0], err


def test_every_preloaded_module_exists():
    """A renamed module would silently drop out of the preload (ranks then import it after the
    fork, slower but correct); this keeps the list honest."""
    assert preload(RANK_PRELOAD) == []
    assert preload(["hicache_diag.no_such_module"]) == ["hicache_diag.no_such_module"]
