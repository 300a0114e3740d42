"""A death the tool caused is never a rank's crash (issue 29): after its hang watch declared a
hang, the tool dumps and reaps every rank; a rank that dies of that SIGKILL, or a peer that logs
the lost connection before its own, is the reaping. The verdict stays hang C, with the culprit
`triage --dumps` names on the same run dir."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hicache_diag.diagnosis.classify import classify_run
from hicache_diag.engines.builtin.launcher import LaunchedRank, Launcher
from hicache_diag.engines.builtin.runtime.server_args import ServerArgs
from tests.conftest import assert_no_children

pytestmark = pytest.mark.process

CLI = [sys.executable, "-m", "hicache_diag.cli.main"]
# A deterministic hang: PP1's scheduler thread sleeps a minute, PP0 waits for it.
HANG = ["--pp", "2", "--fault", "rank-stall:rank=1,ms=60000,after=3", "--hang-timeout", "2"]
# The cascade a peer logs when the rank it talks to is gone (gloo, as the runtime logs it).
CASCADE = (
    "[2026-01-01 00:00:00 PP0 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
    '  File "parallel_state.py", line 75, in _recv_bytes\n'
    "    dist.recv(size, src=src, group=group, tag=tag)\n"
    "RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer "
    "[127.0.0.1]:49040. This is typically caused by a remote worker crashing.\n"
)


def _triage_culprit(run_dir: Path) -> tuple[str, str | None]:
    argv = [*CLI, "triage", "--dumps", str(run_dir), "--json"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    data = json.loads(proc.stdout)
    return data["kind"], (data.get("culprit") or {}).get("label")


@pytest.fixture(scope="module")
def hung_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("reap") / "run"
    argv = [*CLI, "run", *HANG, "--out", str(out), "--json"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 12, proc.stderr[-2000:]
    assert_no_children()
    return out


def test_reaping_leaves_no_cascade_and_both_ranks_hung(hung_run: Path):
    launcher = json.loads((hung_run / "launcher.json").read_text())
    assert [r["state"] for r in launcher["ranks"]] == ["hung", "hung"]
    for rank in (0, 1):  # every rank was stopped before any was killed: nobody saw a peer go
        assert "Connection closed" not in (hung_run / f"rank{rank}.log").read_text()


def test_deaths_and_cascades_while_reaping_stay_hang_c(hung_run: Path, tmp_path: Path):
    """The state seen under CPU load: rank 0 ended by our SIGKILL before the launcher marked it,
    and rank 1 logged the lost connection before its own SIGKILL arrived."""
    run_dir = tmp_path / "run"
    subprocess.run(["cp", "-r", str(hung_run), str(run_dir)], check=True)
    launcher = json.loads((run_dir / "launcher.json").read_text())
    detected = launcher["hang"]["detected_at"]
    launcher["ranks"][0].update(state="crashed", exitcode=-9, signal=9, ended_at=detected + 0.3)
    (run_dir / "launcher.json").write_text(json.dumps(launcher))
    with open(run_dir / "rank1.log", "a") as log:
        log.write(CASCADE.replace("PP0", "PP1"))
    (run_dir / "verdict.json").unlink()
    verdict = classify_run(run_dir)
    assert (verdict.outcome.value, verdict.form.value, verdict.culprit_rank) == ("hang", "C", 1)
    assert any("reaping, not a crash" in line for line in verdict.evidence), verdict.evidence
    assert _triage_culprit(run_dir) == ("hang", "PP1 TP0")
    assert _triage_culprit(hung_run) == ("hang", "PP1 TP0")


def test_a_rank_that_died_before_the_hang_is_still_a_fact(hung_run: Path, tmp_path: Path):
    """Only what ended after the hang was declared is the reaping: a death before it is kept."""
    run_dir = tmp_path / "run"
    subprocess.run(["cp", "-r", str(hung_run), str(run_dir)], check=True)
    launcher = json.loads((run_dir / "launcher.json").read_text())
    detected = launcher["hang"]["detected_at"]
    launcher["ranks"][0].update(state="crashed", exitcode=-9, signal=9, ended_at=detected - 5)
    (run_dir / "launcher.json").write_text(json.dumps(launcher))
    verdict = classify_run(run_dir)
    assert verdict.outcome.value == "crash" and verdict.failed_rank == 0


def test_kill_all_stops_every_rank_before_killing_any(tmp_path: Path):
    """Two real processes: the second reports (to a file) the moment the first is gone. With
    every rank stopped before the first SIGKILL, it never gets to."""
    seen = tmp_path / "seen"
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    first = subprocess.Popen(sleeper, stdout=subprocess.PIPE)
    watcher = (
        "import sys, time\n"
        "sys.stdin.buffer.read()\n"  # EOF: the first process is gone
        f"open({str(seen)!r}, 'w').write('peer lost')\n"
        "time.sleep(60)\n"
    )
    second = subprocess.Popen([sys.executable, "-c", watcher], stdin=first.stdout)
    first.stdout.close()
    time.sleep(1.0)  # both running
    launcher = Launcher(tmp_path, ServerArgs(pp_size=2))
    for rank, proc in enumerate((first, second)):
        log = open(tmp_path / f"rank{rank}.log", "ab")  # noqa: SIM115 - the launcher closes it
        launcher.procs.append(LaunchedRank(rank, rank, 0, proc, log))
    launcher.kill_all("hung")
    launcher.kill_all("killed")  # idempotent: the second call finds nothing alive
    assert [p.state for p in launcher.procs] == ["hung", "hung"]
    assert [p.signal for p in launcher.procs] == [9, 9]
    assert not seen.exists()
