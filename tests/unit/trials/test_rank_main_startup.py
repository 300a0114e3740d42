"""rank_main's start-up path: store port over a pipe, start-up phases, the PDEATHSIG race."""

from __future__ import annotations

import os

import pytest

from hicache_diag.engines.builtin import rank_main
from hicache_diag.trials.forked_process import fork_module
from tests.conftest import assert_no_children


def test_store_port_arrives_on_the_pipe():
    r, w = os.pipe()
    os.write(w, b"40123\n")
    os.close(w)
    assert rank_main._read_port(r) == 40123


def test_a_closed_pipe_is_a_clear_error():
    r, w = os.pipe()
    os.close(w)
    with pytest.raises(SystemExit, match="without a port"):
        rank_main._read_port(r)


def test_startup_phases_are_consecutive_differences(monkeypatch):
    t0 = rank_main._T0
    monkeypatch.setenv(rank_main.LAUNCHED_AT_ENV, repr(t0 - 0.5))
    monkeypatch.setenv("HICACHE_DIAG_RANK_START", "spawn")
    out = rank_main._startup_times(entry=t0 + 0.1, torch=t0 + 1.1, gloo=t0 + 1.3, build=t0 + 1.4)
    assert out["method"] == "spawn"
    assert out["launch"] == pytest.approx(0.5)
    assert [out[k] for k in ("entry", "torch", "gloo", "build")] == pytest.approx(
        [0.1, 1.0, 0.2, 0.1]
    )
    assert out["total"] == pytest.approx(1.9)


@pytest.mark.process
def test_rank_whose_launcher_is_already_gone_exits(tmp_path, monkeypatch):
    """If the launcher died before prctl(PR_SET_PDEATHSIG) ran, no signal ever comes: the rank
    sees it was re-parented and leaves instead of lingering."""
    (tmp_path / "orphan_mod.py").write_text(
        "from hicache_diag.engines.builtin.rank_main import _die_with_parent\n"
        "_die_with_parent()\n"
        "print('still here')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    log = tmp_path / "log"
    codes = {}
    for name, pid in (("stale", "1"), ("ours", str(os.getpid()))):
        with open(log, "ab") as fh:
            env = {rank_main.LAUNCHER_PID_ENV: pid}
            codes[name] = fork_module("orphan_mod", [], fh.fileno(), env).wait()
    assert codes == {"stale": 1, "ours": 0}
    assert log.read_text().count("still here") == 1
    assert_no_children()
