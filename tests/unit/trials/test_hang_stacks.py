"""Hang stacks: py-spy on every rank in parallel under a deadline, else faulthandler (SIGUSR1).

Real processes and real signals; only the py-spy binary is swapped for the edge cases (missing,
hung, ptrace denied).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from hicache_diag import evidence as ev
from hicache_diag.triage import pyspy
from hicache_diag.trials import trial

# A stand-in rank: the same faulthandler registration as rank_main, then a recognisable wait.
RANK = """
import faulthandler, signal, sys, time
fh = open(sys.argv[1], "w")
faulthandler.register(signal.SIGUSR1, file=fh, all_threads=True)
def waiting_like_a_hung_rank():
    print("ready", flush=True)
    while True:
        time.sleep(0.05)
waiting_like_a_hung_rank()
"""


@dataclass
class FakeRank:
    rank: int
    popen: subprocess.Popen

    @property
    def pid(self) -> int:
        return self.popen.pid


class FakeLauncher:
    """Only what dump_rank_stacks uses: alive() and signal_all()."""

    def __init__(self, run_dir: Path, world: int) -> None:
        (run_dir / "stacks").mkdir(parents=True)
        self.procs = []
        for r in range(world):
            cmd = [sys.executable, "-c", RANK, str(run_dir / "stacks" / f"rank{r}.txt")]
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
            assert p.stdout.readline().strip() == "ready"
            self.procs.append(FakeRank(r, p))

    def alive(self) -> list[FakeRank]:
        return [p for p in self.procs if p.popen.poll() is None]

    def signal_all(self, sig: int) -> None:
        for p in self.alive():
            p.popen.send_signal(sig)

    def close(self) -> None:
        for p in self.procs:
            p.popen.kill()
            p.popen.wait()


@pytest.fixture
def ranks(tmp_path, no_leftover_processes):
    launcher = FakeLauncher(tmp_path, world=2)
    yield launcher
    launcher.close()


def _fake_pyspy(tmp_path: Path, body: str) -> str:
    path = tmp_path / "py-spy"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


@pytest.mark.skipif(pyspy.find_pyspy() is None, reason="py-spy is not installed")
@pytest.mark.process
def test_every_rank_is_dumped_by_py_spy(tmp_path, ranks):
    got = trial.dump_rank_stacks(ranks, tmp_path)
    assert got == ev.StacksRecord("py-spy", None)
    for r in (0, 1):
        dump = json.loads((tmp_path / "stacks" / f"rank{r}.json").read_text())
        names = [f["name"] for th in dump for f in th["frames"]]
        assert "waiting_like_a_hung_rank" in names


def _assert_faulthandler_files(tmp_path: Path) -> None:
    for r in (0, 1):
        text = (tmp_path / "stacks" / f"rank{r}.txt").read_text()
        assert "waiting_like_a_hung_rank" in text, text
        assert not (tmp_path / "stacks" / f"rank{r}.json").exists()


@pytest.mark.process
def test_missing_py_spy_falls_back_to_faulthandler(tmp_path, ranks, monkeypatch):
    monkeypatch.setattr(pyspy, "find_pyspy", lambda: None)
    got = trial.dump_rank_stacks(ranks, tmp_path)
    assert got.tool == "faulthandler" and pyspy.NOT_INSTALLED in got.error
    _assert_faulthandler_files(tmp_path)


@pytest.mark.process
def test_ptrace_denied_is_named_and_falls_back(tmp_path, ranks, monkeypatch):
    fake = _fake_pyspy(tmp_path, 'echo "Error: Operation not permitted (os error 1)" >&2; exit 1')
    monkeypatch.setattr(pyspy, "find_pyspy", lambda: fake)
    got = trial.dump_rank_stacks(ranks, tmp_path)
    assert got.tool == "faulthandler" and "CAP_SYS_PTRACE" in got.error
    _assert_faulthandler_files(tmp_path)


@pytest.mark.process
def test_a_hung_py_spy_is_killed_at_the_deadline(tmp_path, ranks, monkeypatch):
    fake = _fake_pyspy(tmp_path, "exec sleep 60")
    monkeypatch.setattr(pyspy, "find_pyspy", lambda: fake)
    monkeypatch.setattr(trial, "STACK_DEADLINE_S", 1.0)
    started = time.monotonic()
    got = trial.dump_rank_stacks(ranks, tmp_path)
    assert time.monotonic() - started < 1.0 + trial.FAULTHANDLER_WAIT_S + 1.0
    assert got.tool == "faulthandler" and "timed out" in got.error
    assert got.error.count("timed out") == 2, "both ranks dumped in parallel, both cut off"
    _assert_faulthandler_files(tmp_path)


def test_unwritten_faulthandler_files_are_dropped(tmp_path):
    (tmp_path / "stacks").mkdir()
    (tmp_path / "stacks" / "rank0.txt").write_text("")
    (tmp_path / "stacks" / "rank1.txt").write_text("Current thread 0x1\n")
    trial.drop_empty_stack_files(tmp_path)
    assert [p.name for p in (tmp_path / "stacks").iterdir()] == ["rank1.txt"]
