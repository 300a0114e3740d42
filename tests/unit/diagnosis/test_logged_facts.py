"""The process facts SGLang's log adds are the classifier's reading (diagnosis/logged_facts.py):
a committed real-SGLang run whose launcher.json is put back to what the runner records now
(before, the runner rewrote it from the tracebacks) classifies to the same verdict."""

from __future__ import annotations

import json
import shutil
import signal
from datetime import datetime
from pathlib import Path

import pytest

from hicache_diag import evidence as ev
from hicache_diag.diagnosis import classify_run
from hicache_diag.diagnosis.load import load_run
from hicache_diag.diagnosis.logged_facts import with_logged_crashes

RUNS = Path(__file__).resolve().parents[3] / "samples" / "runs"
SGLANG_RUNS = sorted(p.name for p in RUNS.glob("sglang-*") if (p / "launcher.json").is_file())


def _as_recorded(launcher: dict) -> dict:
    """What the runner records: a scheduler that exited 0 is `exited` whatever its log says,
    and the first failure is the first death its poll saw (here: another rank's, when one
    ended too, the worst case for the reading)."""
    raw = json.loads(json.dumps(launcher))
    for e in raw["ranks"]:
        if e["state"] == "crashed" and e.get("exitcode") == 0:
            e["state"] = "exited"
    first = raw.get("first_failure")
    ended = [e for e in raw["ranks"] if e.get("ended_at") is not None]
    if first and ended:
        other = [e for e in ended if e["rank"] != first["rank"]] or ended
        e = other[0]
        raw["first_failure"] = {
            "rank": e["rank"],
            "t": e["ended_at"],
            "pid": e.get("pid"),
            "exitcode": e.get("exitcode"),
            "signal": e.get("signal"),
        }
    return raw


@pytest.mark.parametrize("name", SGLANG_RUNS)
def test_a_run_as_recorded_now_classifies_as_before(tmp_path, name):
    run = tmp_path / name
    shutil.copytree(RUNS / name, run)
    before = classify_run(RUNS / name)
    launcher = json.loads((run / "launcher.json").read_text())
    (run / "launcher.json").write_text(json.dumps(_as_recorded(launcher)))
    after = classify_run(run)
    keys = ("outcome", "form", "failed_rank", "culprit_rank", "signature")
    assert [getattr(after, k) for k in keys] == [getattr(before, k) for k in keys]
    assert [(r.rank, r.state) for r in after.ranks] == [(r.rank, r.state) for r in before.ranks]


def test_the_reading_is_what_names_the_root():
    """The first failure moves to the rank that raised only on the launcher's teardown line
    (SIGQUIT, then SIGKILL of the tree); without it the recorded first death stands."""
    run = load_run(RUNS / "sglang-0.5.23-form-a")
    raw = _as_recorded(json.loads((run.run_dir / "launcher.json").read_text()))
    raw["first_failure"]["rank"] = 0  # the runner's poll saw PP0 go first
    recorded = ev.LauncherRecord.from_json(raw)
    server_log = (run.run_dir / "server.log").read_text()
    assert with_logged_crashes(recorded, run.logs, server_log).first_failure.rank == 1
    quiet = "".join(ln for ln in server_log.splitlines(True) if "SIGQUIT received" not in ln)
    assert with_logged_crashes(recorded, run.logs, quiet).first_failure.rank == 0
    assert recorded.ranks[1].state == "exited"  # a new record is read, the recorded one stays
    assert with_logged_crashes(recorded, run.logs, quiet).ranks[1].state == "crashed"


def test_a_teardown_sigkill_recorded_first_is_not_the_root(tmp_path):
    """SGLang's launcher SIGKILLs the tree after PP1 raised; the runner's poll happens to see
    PP0's SIGKILL first. The reading makes that death the teardown and PP1 the root."""
    name = "sglang-0.5.23-form-a"
    run = tmp_path / name
    shutil.copytree(RUNS / name, run)
    raw = _as_recorded(json.loads((run / "launcher.json").read_text()))
    pp0, pp1 = raw["ranks"]
    pp0.update(state="crashed", exitcode=-9, signal=9, ended_at=pp1["ended_at"])
    raw["first_failure"] = {
        "rank": 0,
        "t": pp1["ended_at"] - 0.01,
        "pid": pp0["pid"],
        "exitcode": -9,
        "signal": 9,
    }
    (run / "launcher.json").write_text(json.dumps(raw))
    v, before = classify_run(run), classify_run(RUNS / name)
    assert (v.outcome, v.form, v.failed_rank) == (before.outcome, before.form, 1)
    assert {r.rank: r.state for r in v.ranks} == {0: "killed", 1: "crashed"}


# Lines as SGLang 0.5.12.post1 printed them in a form-A run here (paths shortened, the echoed
# source lines left out).
PP1_LOG = """\
[2026-12-01 05:38:08 PP1] Scheduler hit an exception: Traceback (most recent call last):
  File "/v/sglang/srt/managers/scheduler.py", line 3049, in run_scheduler_process
  File "/v/sglang/srt/layers/rotary_embedding/base.py", line 232, in forward_native
RuntimeError: shape '[58, -1, 16]' is invalid for input of size 7744
"""
LOGGED = datetime.fromisoformat("2026-12-01 05:38:08").timestamp()  # as the log parser reads it
TEARDOWN = (
    "[2026-12-01 05:38:08] SIGQUIT received. signum=None, frame=None. It usually means one "
    "child failed.\n"
)


def _launcher(first: dict | None, *states, hang: dict | None = None) -> ev.LauncherRecord:
    ranks = [
        {
            "rank": r,
            "pp": r,
            "tp": 0,
            "pid": 100 + r,
            "state": st,
            "exitcode": code,
            "signal": sig,
            "ended_at": LOGGED + 0.5 + r * 4e-5,
        }
        for r, (st, code, sig) in enumerate(states)
    ]
    return ev.LauncherRecord.from_json({"ranks": ranks, "first_failure": first, "hang": hang})


def _states(launcher: ev.LauncherRecord) -> list[str]:
    return [e.state for e in launcher.ranks]


def test_teardown_sigkills_are_not_the_first_failure():
    killed = ("crashed", None, signal.SIGKILL)
    recorded = _launcher({"rank": 0, "t": 1000.0, "signal": 9}, killed, killed)  # PP0 polled first
    read = with_logged_crashes(recorded, {0: "", 1: PP1_LOG}, PP1_LOG + TEARDOWN)
    assert _states(read) == ["killed", "crashed"] and read.first_failure.rank == 1
    assert _states(recorded) == ["crashed", "crashed"]  # what the runner recorded stays


def test_a_fatal_exception_with_exit_0_is_a_crash():
    recorded = _launcher({"rank": 1, "t": 1000.0}, ("exited", 0, None), ("exited", 0, None))
    assert _states(with_logged_crashes(recorded, {0: "", 1: PP1_LOG}, PP1_LOG)) == [
        "exited",
        "crashed",
    ]


def test_without_a_logged_exception_a_sigkill_stays_a_death():
    # A scheduler someone SIGKILLed: no traceback anywhere, the teardown follows that death.
    recorded = _launcher(
        {"rank": 1, "t": 1000.0}, ("exited", 0, None), ("crashed", None, signal.SIGKILL)
    )
    read = with_logged_crashes(recorded, {0: "", 1: ""}, TEARDOWN)
    assert _states(read) == ["exited", "crashed"] and read.first_failure.rank == 1


def test_a_sigkill_before_only_cascades_stays_the_root():
    # A user SIGKILLs PP1; PP0 then logs `Connection closed by peer` as its fatal exception and
    # the launcher tears down. The cascade is no root cause: PP1's death stays a death.
    cascade = TEARDOWN + (
        "[2026-12-01 05:38:09 PP0] Scheduler hit an exception: Traceback (most recent call "
        'last):\n  File "/t/distributed_c10d.py", line 3, in recv\n'
        "RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection "
        "closed by peer [127.0.0.1]:17092\n"
    )
    pp0 = cascade.split("\n", 1)[1]
    recorded = _launcher(
        {"rank": 1, "t": 1000.0, "signal": 9},
        ("crashed", 0, None),
        ("crashed", None, signal.SIGKILL),
    )
    read = with_logged_crashes(recorded, {0: pp0, 1: ""}, cascade)
    assert _states(read) == ["crashed", "crashed"] and read.first_failure.rank == 1


def test_after_sglangs_watchdog_the_record_stands():
    """The watchdog's teardown was recorded by the runner already (sglang/trial.py)."""
    hang = {"detected_by": "sglang-watchdog", "stalled_ranks": [0, 1]}
    recorded = _launcher(None, ("killed", None, None), ("killed", None, None), hang=hang)
    assert with_logged_crashes(recorded, {0: "", 1: PP1_LOG}, PP1_LOG + TEARDOWN) is recorded
