"""Process facts decide: a rank killed by a signal, a stopped rank, a rank the others wait on."""

from hicache_diag.diagnosis import classify_run
from hicache_diag.evidence.verdict import CrashForm, ExitCode, Outcome

from .builder import PEER_ERR, RunDir, pyspy_dump


def _killed(rd: RunDir, rank: int, at_step: int, sig: int = 9, t: float = 1000.0) -> RunDir:
    rd.stop_at[rank] = at_step
    for e in rd.launcher["ranks"]:
        if e["rank"] == rank:
            e.update(state="crashed", exitcode=-sig, signal=sig)
    rd.launcher["first_failure"] = {"rank": rank, "t": t, "exitcode": -sig, "signal": sig}
    return rd


def _survivor_cascade(rd: RunDir, rank: int) -> RunDir:
    rd.crash(rank, 6, PEER_ERR, t=1001.0)
    rd.launcher["first_failure"]["rank"] = 1  # crash() keeps the earlier t; the kill came first
    for e in rd.launcher["ranks"]:
        if e["rank"] == rank:
            e.update(state="killed", exitcode=-9, signal=9)  # reaped by us after the grace
    return rd


def test_sigkilled_rank_is_failed_and_culprit_survivor_is_cascade(tmp_path):
    rd = _survivor_cascade(_killed(RunDir(tmp_path), 1, 5), 0)
    v = classify_run(rd.write())
    assert (v.outcome, v.form, v.failed_rank, v.culprit_rank) == (Outcome.CRASH, None, 1, 1)
    assert v.exit_code is ExitCode.CRASH_OTHER
    assert "SIGKILL" in v.signature
    assert any("rank 0 secondary (cascade)" in line for line in v.evidence)


def test_sigkilled_rank_after_peers_finished_is_not_ok(tmp_path):
    v = classify_run(_killed(RunDir(tmp_path), 0, 9, sig=15).write())
    assert (v.outcome, v.failed_rank) == (Outcome.CRASH, 0) and "SIGTERM" in v.signature


def test_a_lone_cascade_never_blames_the_survivor(tmp_path):
    rd = RunDir(tmp_path).crash(0, 6, PEER_ERR, t=1001.0)  # rank 1's death was not recorded
    v = classify_run(rd.write())
    assert (v.outcome, v.form, v.failed_rank, v.culprit_rank) == (Outcome.CRASH, None, 1, 1)
    assert v.exit_code is ExitCode.CRASH_OTHER


def test_oom_kill_is_named(tmp_path):
    rd = _killed(RunDir(tmp_path), 1, 5)
    rd.launcher["oom_kills"] = 1
    v = classify_run(rd.write())
    assert "OOM killer" in v.signature


def test_injected_faults_are_shown_but_never_pick_the_culprit(tmp_path):
    rd = _killed(RunDir(tmp_path), 0, 5)
    rd.manifest["faults"] = ["rank-stall:rank=1,ms=50"]
    v = classify_run(rd.write())
    assert v.culprit_rank == 0
    # no step record says it fired: asked for, never called injected (issue 41)
    assert "faults asked for that never fired: rank-stall:rank=1,ms=50" in v.evidence


def _hang(rd: RunDir, **extra) -> RunDir:
    rd.launcher["hang"] = {
        "detected_at": 1010.0,
        "last_progress": {"0": 1005.0, "1": 1005.0},
        "stalled_ranks": [0, 1],
        **extra,
    }
    for e in rd.launcher["ranks"]:
        e["state"] = "hung"
    return rd


def test_stopped_rank_is_the_hang_culprit_even_with_a_peer_at_a_hicache_wait(tmp_path):
    rd = _hang(RunDir(tmp_path), proc_status={"0": "sleeping", "1": "stopped"}, stopped_ranks=[1])
    rd.stacks = {
        0: pyspy_dump(
            (
                "all_reduce_tp",
                "/x/hicache_diag/engines/builtin/runtime/distributed/parallel_state.py",
                5,
            ),
            (
                "HiRadixCache.writing_check",
                "/x/hicache_diag/engines/builtin/runtime/mem_cache/hr.py",
                7,
            ),
        )
    }
    v = classify_run(rd.write())
    assert (v.outcome, v.form, v.failed_rank, v.culprit_rank) == (Outcome.HANG, CrashForm.C, 1, 1)
    assert any("rank 1 was stopped (kernel state T" in line for line in v.evidence)


def test_sleeping_rank_is_the_culprit_when_its_peer_waits_on_it(tmp_path):
    rd = _hang(RunDir(tmp_path))
    rd.stacks = {
        0: pyspy_dump(
            ("recv", "/t/distributed_c10d.py", 10),
            ("pp_sync", "/x/hicache_diag/engines/builtin/runtime/mem_cache/l2_protocol.py", 9),
        ),
        1: pyspy_dump(
            ("sleep", "/x/hicache_diag/engines/builtin/runtime/managers/scheduler.py", 70),
            ("event_loop_pp", "/x/hicache_diag/engines/builtin/runtime/managers/sched.py", 3),
        ),
    }
    v = classify_run(rd.write())
    assert (v.failed_rank, v.culprit_rank) == (1, 1)
    assert any("not waiting on a peer" in line for line in v.evidence)
