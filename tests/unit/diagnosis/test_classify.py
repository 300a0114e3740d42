import json

import pytest

from hicache_diag.diagnosis import classify_run
from hicache_diag.diagnosis.classify import verdict_from
from hicache_diag.diagnosis.load import load_run
from hicache_diag.errors import RunDirError
from hicache_diag.evidence.verdict import CrashForm, DivergenceSource, ExitCode, Outcome

from .builder import PEER_ERR, POP_ERR, SHAPE_ERR, RunDir, pyspy_dump


def test_clean_run_is_ok(tmp_path):
    v = classify_run(RunDir(tmp_path).write())
    assert v.outcome is Outcome.OK and v.form is None
    assert v.first_divergence is None
    assert v.steps == 10 and v.seed == 7
    assert [r.state for r in v.ranks] == ["exited", "exited"]
    assert v.exit_code is ExitCode.OK


def test_form_a_root_cause_is_first_in_time_not_the_cascade(tmp_path):
    rd = RunDir(tmp_path)
    # rank 0 dies of the cascade *later*; rank 1's shape error is the root cause.
    rd.set(1, 5, extend_num_tokens=12).crash(1, 5, SHAPE_ERR, t=1000.05)
    rd.crash(0, 6, PEER_ERR, t=1000.07, state="killed")
    v = classify_run(rd.write())
    assert (v.outcome, v.form, v.failed_rank) == (Outcome.CRASH, CrashForm.A, 1)
    assert "shape '[12, -1, 16]'" in v.signature
    assert any("secondary" in line and "rank 0" in line for line in v.evidence)
    assert v.first_divergence.field == "extend_num_tokens"
    assert v.first_divergence.values == {"0": 16, "1": 12}
    ranks = {r.rank: r for r in v.ranks}
    assert ranks[1].state == "crashed" and ranks[1].where.startswith("event_loop_pp")
    assert v.exit_code is ExitCode.FORM_A


def test_form_a_even_when_cascade_is_logged_first(tmp_path):
    rd = RunDir(tmp_path)
    rd.crash(0, 5, PEER_ERR, t=1000.01).crash(1, 5, SHAPE_ERR, t=1000.02)
    v = classify_run(rd.write())
    assert (v.form, v.failed_rank) == (CrashForm.A, 1)


def test_other_runtime_error_downstream_with_token_mismatch_is_form_a(tmp_path):
    rd = RunDir(tmp_path)
    rd.set(1, 4, extend_num_tokens=8)
    rd.crash(1, 4, "RuntimeError: The size of tensor a (8) must match tensor b (16)", t=1000.04)
    v = classify_run(rd.write())
    assert (v.outcome, v.form, v.failed_rank) == (Outcome.CRASH, CrashForm.A, 1)


def test_other_runtime_error_without_mismatch_is_unknown_crash(tmp_path):
    rd = RunDir(tmp_path).crash(1, 4, "RuntimeError: something else", t=1000.04)
    v = classify_run(rd.write())
    assert (v.outcome, v.form) == (Outcome.CRASH, None)
    assert v.exit_code is ExitCode.CRASH_OTHER  # docs/design.md §4: 16, a crash of another form


def test_form_b_pop_from_empty_with_ack_culprit(tmp_path):
    rd = RunDir(tmp_path)
    rd.set(1, 3, acks_ready={"write": 0, "load": 0}, acks_consumed={"write": 0, "load": 0})
    rd.set(1, 3, faults_fired=[{"fault": "dma-delay", "step": 3}])
    rd.crash(1, 6, POP_ERR, t=1000.06)
    v = classify_run(rd.write())
    assert (v.outcome, v.form, v.failed_rank) == (Outcome.CRASH, CrashForm.B, 1)
    assert v.first_divergence.step == 3 and v.first_divergence.field == "acks_consumed"
    assert v.first_divergence.source is DivergenceSource.DMA_ACK_COUNT
    assert v.culprit_rank == 1
    assert {r.rank: r.where for r in v.ranks}[1] == "writing_check (cache_controller.py:9)"


def test_form_b_keyerror_on_bookkeeping(tmp_path):
    err = (
        '  File "/x/hiradix_cache.py", line 3, in writing_check\n'
        "    node = self.ongoing_write_through[ack_id]\nKeyError: 17"
    )
    v = classify_run(RunDir(tmp_path).crash(0, 5, err, t=1000.0).write())
    assert (v.form, v.failed_rank) == (CrashForm.B, 0)


def test_plain_keyerror_is_not_form_b(tmp_path):
    err = "  File \"/x/a.py\", line 3, in f\n    d[k]\nKeyError: 'model'"
    v = classify_run(RunDir(tmp_path).crash(0, 5, err, t=1000.0).write())
    assert v.form is None


def test_form_c_hang_picks_the_rank_at_the_hicache_wait(tmp_path):
    rd = RunDir(tmp_path)
    rd.launcher["hang"] = {
        "detected_at": 1006.0,
        "last_progress": {"0": 1000.5, "1": 1000.4},
        "stalled_ranks": [0, 1],
    }
    for e in rd.launcher["ranks"]:
        e["state"] = "hung"
    rd.stacks = {
        0: pyspy_dump(
            ("all_reduce", "/t/distributed_c10d.py", 10),
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
            ("event_loop_pp", "/x/hicache_diag/engines/builtin/runtime/managers/sched.py", 3),
        ),
        1: pyspy_dump(
            ("recv", "/t/distributed_c10d.py", 10),
            (
                "point_to_point_pyobj",
                "/x/hicache_diag/engines/builtin/runtime/distributed/ps.py",
                9,
            ),
        ),
    }
    v = classify_run(rd.write())
    assert (v.outcome, v.form, v.failed_rank) == (Outcome.HANG, CrashForm.C, 0)
    where = {r.rank: (r.state, r.where) for r in v.ranks}
    assert where[0] == (
        "blocked",
        "all_reduce_tp (parallel_state.py:5) <- HiRadixCache.writing_check (hr.py:7)",
    )
    assert where[1] == ("blocked", "point_to_point_pyobj (ps.py:9)")
    assert any("writing_check" in line for line in v.evidence)
    assert v.exit_code is ExitCode.FORM_C


def test_hang_without_stacks_explains_why(tmp_path):
    rd = RunDir(tmp_path)
    rd.launcher["hang"] = {
        "detected_at": 1,
        "last_progress": {"0": 5.0, "1": 3.0},
        "stalled_ranks": [0, 1],
    }
    rd.launcher["stacks"] = {"tool": None, "error": "ptrace denied: need CAP_SYS_PTRACE"}
    v = classify_run(rd.write())
    assert v.failed_rank == 1
    assert any("CAP_SYS_PTRACE" in line for line in v.evidence)


def test_faulthandler_text_stacks(tmp_path):
    rd = RunDir(tmp_path)
    rd.launcher["hang"] = {"detected_at": 1, "last_progress": {}, "stalled_ranks": [1]}
    for e in rd.launcher["ranks"]:
        e["state"] = "hung"  # rank 0 had not exited (an exited rank is the culprit itself)
    rd.stacks = {
        1: "Current thread 0x1 (most recent call first):\n"
        '  File "/x/hicache_diag/engines/builtin/runtime/comm.py", line 4 in pp_sync\n'
        '  File "/x/sched.py", line 9 in event_loop_pp\n'
    }
    v = classify_run(rd.write())
    assert v.failed_rank == 1
    assert {r.rank: r.where for r in v.ranks}[1] == "pp_sync (comm.py:4)"


def test_latent_divergence_without_crash(tmp_path):
    rd = RunDir(tmp_path)
    rd.set(0, 6, host_alloc_failed=2)
    rd.set(0, 7, write_backs=0, tree_digest="x")
    v = classify_run(rd.write())
    assert v.outcome is Outcome.DIVERGED and v.exit_code is ExitCode.DIVERGED
    assert (v.first_divergence.step, v.first_divergence.field) == (7, "write_backs")
    assert v.first_divergence.source is DivergenceSource.HOST_ALLOC
    assert v.culprit_rank == 0


def test_wrong_output_beyond_tolerance(tmp_path):
    rd = RunDir(tmp_path)
    rd.outputs = {"r0": [1, 2, 3], "r1": [1, 9, 3], "r2": [1, 2, 3]}
    v = classify_run(rd.write())
    assert v.outcome is Outcome.WRONG_OUTPUT
    assert any("r1: token 1 is 9, reference 2" in line for line in v.evidence)


def test_wrong_output_within_tie_tolerance_is_ok(tmp_path):
    rd = RunDir(tmp_path)
    rd.outputs = {"r0": [1, 2, 3], "r1": [1, 9, 7], "r2": [1, 2, 3]}
    rd.reference["gaps"] = {"r1": [5.0, 1e-6, 3.0]}
    rd.reference["tolerance"] = 1e-4  # a recorded tolerance wins over the default
    assert classify_run(rd.write()).outcome is Outcome.OK


def test_leak_when_inflight_sends_grow_on_one_rank(tmp_path):
    rd = RunDir(tmp_path, steps=40)
    for s in range(40):
        rd.set(0, s, inflight_sends=s)
        rd.set(1, s, inflight_sends=s % 2)
    v = classify_run(rd.write())
    assert (v.outcome, v.failed_rank) == (Outcome.LEAK, 0)
    assert v.exit_code is ExitCode.LEAK


def test_bounded_inflight_sends_are_not_a_leak(tmp_path):
    rd = RunDir(tmp_path, steps=40)
    for s in range(40):
        rd.set(0, s, inflight_sends=s % 3)
    assert classify_run(rd.write()).outcome is Outcome.OK


def test_a_broken_check_yields_unknown_evidence_not_a_crash(tmp_path, monkeypatch):
    from hicache_diag.diagnosis import checks

    def boom(run):
        raise ZeroDivisionError("bad data")

    monkeypatch.setattr(checks, "check_leak", boom)
    v = classify_run(RunDir(tmp_path).write())
    assert v.outcome is Outcome.OK
    assert "check leak: unknown (ZeroDivisionError: bad data)" in v.evidence


def test_missing_run_dir_and_empty_dir(tmp_path):
    with pytest.raises(RunDirError, match="does not exist"):
        classify_run(tmp_path / "nope")
    with pytest.raises(RunDirError, match="missing manifest.json"):
        classify_run(tmp_path)


def test_partial_run_tolerates_torn_line_and_missing_files(tmp_path):
    rd = RunDir(tmp_path)
    rd.launcher = None
    rd.outputs = rd.reference = None
    root = rd.write()
    with (root / "rank1.jsonl").open("a") as fh:
        fh.write('{"step": 10, "rank": 1, "extend_')
    run = load_run(root)
    assert run.bad_lines == 1
    assert set(run.missing) == {"launcher.json", "outputs.json", "reference.json"}
    v = verdict_from(run)
    # Nothing failed, but nothing shows the run finished either: never `ok` (exit 3).
    assert v.outcome is Outcome.UNDECIDED and v.exit_code is ExitCode.UNDECIDED
    assert v.signature.startswith("launcher.json is missing")
    assert "missing: launcher.json" in v.evidence


def test_interrupted_run_is_interrupted_not_ok(tmp_path):
    rd = RunDir(tmp_path)
    rd.launcher["interrupted"] = True
    v = classify_run(rd.write())
    assert v.outcome is Outcome.INTERRUPTED and int(v.exit_code) == 130


def test_zero_step_run_is_undecided(tmp_path):
    rd = RunDir(tmp_path)
    root = rd.write()
    for path in root.glob("rank*.jsonl"):
        path.write_text("")
    v = classify_run(root)
    assert v.outcome is Outcome.UNDECIDED and "no rank recorded a step" in v.evidence


def test_verdict_round_trips_as_json(tmp_path):
    rd = RunDir(tmp_path)
    rd.set(1, 5, extend_num_tokens=12).crash(1, 5, SHAPE_ERR, t=1000.05)
    v = classify_run(rd.write())
    data = json.loads(json.dumps(v.to_json()))
    assert data["schema"] == "hicache-diag/verdict/v1" and data["exit_code"] == 10
    assert data["first_divergence"]["source"] == "unknown"


def test_wrong_output_against_the_harness_reference_format(tmp_path):
    # trials/reference.py writes {rid: {"tokens": [...], "top2_gap": [...]}} and no tolerance.
    rd = RunDir(tmp_path)
    rd.reference = {
        "r0": {"tokens": [1, 2, 3], "top2_gap": [1.0, 5e-4, 1.0]},
        "r1": {"tokens": [4, 5, 6], "top2_gap": [1.0, 0.5, 1.0]},
    }
    rd.outputs = {"r0": [1, 7, 9], "r1": [4, 5, 6]}
    assert classify_run(rd.write()).outcome is Outcome.OK  # r0 flipped at a tie (gap < 1e-3)
    rd.outputs = {"r0": [1, 2, 3], "r1": [4, 8, 6]}
    v = classify_run(rd.write())
    assert v.outcome is Outcome.WRONG_OUTPUT and v.signature == "wrong output for r1"
    rd.outputs = {"r0": [1, 2, 3, 4], "r1": [4, 5, 6]}
    assert classify_run(rd.write()).outcome is Outcome.WRONG_OUTPUT


def test_hang_tie_picks_the_receiving_rank_and_iso_times_give_duration(tmp_path):
    # A send and a recv both blocked: the culprit rule names no rank (a network suspect), so
    # the progress facts decide: a tie, broken by the rank that waits to receive.
    rd = RunDir(tmp_path)
    rd.launcher["hang"] = {
        "detected_at": 1,
        "last_progress": {"0": 5.0, "1": 5.0},
        "stalled_ranks": [0, 1],
    }
    rd.launcher["started_at"] = "2026-11-29T18:20:01.876+00:00"
    rd.launcher["ended_at"] = "2026-11-29T18:20:10.376+00:00"
    rd.stacks = {
        0: pyspy_dump(
            ("send", "/t/distributed_c10d.py", 1),
            ("_send_bytes", "/x/hicache_diag/engines/builtin/runtime/distributed/ps.py", 39),
        ),
        1: pyspy_dump(
            ("recv", "/t/distributed_c10d.py", 1),
            ("_recv_bytes", "/x/hicache_diag/engines/builtin/runtime/distributed/ps.py", 62),
        ),
    }
    v = classify_run(rd.write())
    assert (v.form, v.failed_rank) == (CrashForm.C, 1)
    assert v.duration_s == pytest.approx(8.5)


def test_a_logged_traceback_on_a_rank_that_exited_0_is_not_a_crash(tmp_path):
    rd = RunDir(tmp_path)
    rd.logs[1] += (
        "[2026-11-29 10:00:01 PP1 TP0] Prefetch query failed, retrying: Traceback (most recent "
        'call last):\n  File "/x/hicache_storage.py", line 9, in batch_exists\n    raise\n'
        "ValueError: handled and logged\n"
    )
    assert classify_run(rd.write()).outcome is Outcome.OK


def test_a_scheduler_that_died_of_its_exception_crashed_though_it_exited_0(tmp_path):
    # Real SGLang 0.5.23: run_scheduler_process logs `Scheduler hit an exception`, SIGQUITs its
    # parent and returns, so the scheduler exits 0 (seen: form B on PP1, both exit codes 0).
    rd = RunDir(tmp_path).crash(1, 9, POP_ERR, t=1000.0)
    rd.launcher["ranks"][1].update(state="exited", exitcode=0)
    rd.launcher["first_failure"] = {"rank": 1, "t": 1000.0, "exitcode": 0}
    v = classify_run(rd.write())
    assert (v.outcome, v.form, v.failed_rank) == (Outcome.CRASH, CrashForm.B, 1), v.evidence


def test_requests_the_server_never_answered_are_not_ok(tmp_path):
    # Nothing else wrong in the run dir, but the client's requests died with the connection:
    # an empty outputs.json equals an empty reference, which is no evidence of health.
    rd = RunDir(tmp_path)
    rd.outputs, rd.reference = {}, {"tokens": {}, "tolerance": 0.0}
    root = rd.write()
    (root / "requests.json").write_text(
        json.dumps(
            {
                "errors": {
                    "r0000": "RemoteDisconnected: Remote end closed connection without response"
                }
            }
        )
    )
    v = classify_run(root)
    assert v.outcome is Outcome.UNDECIDED, v.evidence
    assert "1 request(s) got no answer from the server (r0000: RemoteDisconnected" in v.signature


def _tp_hang(tmp_path, failed_on: dict[int, int]) -> RunDir:
    # Real SGLang 0.5.13, PP1 x TP2: TP1's host allocs failed in the step it then skipped
    # writing_check's all_reduce; TP0 entered it and waits. TP0 never finished that step, so no
    # recorded step differs; the py-spy stacks put the wait on TP0.
    rd = RunDir(tmp_path)
    rd.stop_at = {0: 8}
    for rank, n in failed_on.items():
        rd.set(rank, 9 if rank else 8, host_alloc_failed=n)
    rd.launcher["hang"] = {
        "detected_at": 1,
        "last_progress": {"0": 5.0, "1": 5.0},
        "stalled_ranks": [0, 1],
    }
    rd.stacks = {
        0: pyspy_dump(
            ("all_reduce", "/t/distributed_c10d.py", 3252),
            ("_all_reduce_attn_groups", "/s/mem_cache/hiradix_cache.py", 196),
            ("loading_check", "/s/mem_cache/hiradix_cache.py", 600),
        ),
        1: pyspy_dump(
            ("broadcast", "/t/distributed_c10d.py", 3151),
            ("_broadcast_reqs_across_ranks", "/s/managers/request_receiver.py", 187),
        ),
    }
    return rd


def test_hang_with_no_divergence_names_the_rank_whose_own_allocs_failed(tmp_path):
    v = classify_run(_tp_hang(tmp_path, {1: 2}).write())
    assert (v.outcome, v.form, v.failed_rank) == (Outcome.HANG, CrashForm.C, 0)
    assert v.first_divergence is None and v.culprit_rank == 1, v.evidence
    want = (
        "only rank 1's host allocs failed in its last 8 recorded steps (2, the last at "
        "step 9); source host-alloc"
    )
    assert any(want in line for line in v.evidence), v.evidence


def test_local_inputs_on_every_rank_name_no_one_else(tmp_path):
    v = classify_run(_tp_hang(tmp_path, {0: 1, 1: 2}).write())
    assert v.culprit_rank == v.failed_rank == 0
    assert not any("no recorded step differs" in e for e in v.evidence)
