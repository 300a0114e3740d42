"""Meaning over patterns (issue 21): who stopped whom, the watchdog's outputs in every wording,
NCCL's heartbeat monitor, rank labels of every dimension and damaged prefixes, and honest
answers when the evidence is thin. Texts are in the formats SGLang / torch print them."""

from __future__ import annotations

from hicache_diag.evidence.ranks import parse_rank_tokens
from hicache_diag.logs.lines import normalise
from hicache_diag.logs.parse import parse_log_lines
from hicache_diag.triage.classify import classify

TB = "Traceback (most recent call last):"
PYSPY_PP0_BLOCKED = """\
[2026-01-01 00:05:00 PP0 TP0] Pyspy dump for PID 4101:
Process 4101: sglang::scheduler_PP0_TP0
Python v3.12.3 (/usr/bin/python3.12)

Thread 4101 (idle): "MainThread"
    wait (torch/distributed/distributed_c10d.py:3100)
    _drain_async_work (sglang/srt/mem_cache/unified_radix_cache.py:380)
    _pp_sync (sglang/srt/mem_cache/unified_radix_cache.py:395)
    check_hicache_events (sglang/srt/mem_cache/unified_radix_cache.py:610)
    event_loop_pp (sglang/srt/managers/scheduler_pp_mixin.py:170)
"""
BUSY = "".join(
    f"[2026-01-01 00:00:{s:02d} PP{p} TP0] Decode batch, #running-req: 8, #token: 512, "
    "gen throughput (token/s): 90.1\n"
    for s in range(5)
    for p in range(2)
)
TEARDOWN = """\
[2026-01-01 00:10:00] SIGTERM received. signum=None frame=None. Draining requests and shutting down...
[2026-01-01 00:10:05] Subprocess scheduler_0 (pid=4101) crashed with exit code -15. Triggering SIGQUIT for cleanup...
[2026-01-01 00:10:05] SIGQUIT received. signum=None, frame=None. It usually means one child failed.
[2026-01-01 00:10:05 PP1 TP0] Scheduler hit an exception: Traceback (most recent call last):
  File "/s/parallel_state.py", line 1, in recv_object
RuntimeError: [pair.cc:547] Connection closed by peer [10.0.0.2]:1234
[2026-01-01 00:10:06] kill_process_tree called: parent_pid=4000, include_parent=True, pid=4000
"""  # noqa: E501


def triage(text: str, **kw):
    return classify([], parse_log_lines(text.splitlines(), "t.log"), **kw)


def verdict(report):
    culprit = report.culprit.rank.label if report.culprit else None
    return report.kind, report.form, culprit, int(report.exit_code)


# --- 1. the operator's stop is never the crash ---------------------------------------------


def test_a_busy_server_stopped_by_its_operator_is_busy_not_crashed():
    report = triage(BUSY + TEARDOWN)
    assert verdict(report)[:2] == ("busy", None)
    assert any("stopped from outside" in e for e in report.evidence)
    assert any("set aside 1 error" in e for e in report.evidence)


def test_a_hang_then_the_operators_stop_is_the_hang_and_its_dumps_decide():
    report = triage(BUSY + PYSPY_PP0_BLOCKED + TEARDOWN)
    assert verdict(report)[:2] == ("hang", "C") and int(report.exit_code) == 12
    assert any(r.wait_site and r.wait_site.startswith("hicache-pp-sync") for r in report.ranks)


def _drain(stamps: list[int], rids: str = "['a', 'b']") -> str:
    """SGLang's drain reports after SIGTERM, one per stamp (seconds past 00:10)."""
    n = rids.count("'") // 2
    return "".join(
        f"[2026-01-01 00:10:{s:02d}] Gracefully exiting... Remaining number of requests {n}. "
        f"Remaining requests remaining_rids={rids}.\n"
        for s in stamps
    )


STOP = "[2026-01-01 00:10:00] SIGTERM received. signum=None frame=None. Draining requests...\n"


def test_a_drain_that_finishes_nothing_after_the_last_batch_is_a_hang_the_stop_ended():
    report = triage(BUSY + STOP + _drain([1, 6, 11, 16]))
    assert verdict(report) == ("hang", "C", None, 12) and report.confidence == "low"
    assert "stopped making progress" in report.evidence[1]
    assert any("--discover" in s for s in report.next_steps)


def test_a_drain_with_batches_between_its_reports_or_that_ends_is_not_a_hang():
    batches = BUSY.replace("00:00:", "00:10:0")  # batch lines stamped 00:10:00-04, PP0 and PP1
    moving = STOP + _drain([1]) + batches + _drain([5, 9])  # a batch after the first report
    assert verdict(triage(BUSY + moving))[0] == "busy"
    changing = _drain([1, 6]) + _drain([11], "['c', 'd']")  # requests finish: others remain
    assert verdict(triage(BUSY + STOP + changing))[0] == "busy"
    assert verdict(triage(BUSY + STOP + _drain([1, 6])))[0] == "busy"  # two reports: 5 s only
    done = _drain([1, 6, 11], "[]")  # nothing in flight: the drain is done
    assert verdict(triage(BUSY + STOP + done))[0] == "busy"


def test_a_crash_before_the_stop_stays_the_crash():
    crash = (
        f"[2026-01-01 00:09:00 PP1 TP0] Scheduler hit an exception: {TB}\n"
        '  File "/s/hiradix_cache.py", line 3, in writing_check\n'
        "IndexError: pop from empty list\n"
    )
    assert verdict(triage(BUSY + crash + TEARDOWN)) == ("crash", "B", "PP1 TP0", 11)


def test_a_child_killed_by_sigkill_without_a_stop_is_still_a_crash():
    line = "[2026-01-01 00:00:09] Subprocess scheduler_1 (pid=7) crashed with exit code -9.\n"
    assert verdict(triage(BUSY + line))[0] == "crash"


def test_a_child_ended_by_sigterm_is_a_stop_from_outside():
    line = "[2026-01-01 00:00:09] Subprocess scheduler_1 (pid=7) crashed with exit code -15.\n"
    report = triage(BUSY + line)
    assert report.kind == "busy"
    assert any("killed by SIGTERM" in e for e in report.evidence)


def test_keyboard_interrupt_after_the_stop_is_teardown():
    ctrl_c = (
        "[2026-01-01 00:10:00] Received SIGINT\n"
        f"[2026-01-01 00:10:00 PP0 TP0] {TB}\n"
        '  File "/s/scheduler.py", line 9, in event_loop_pp\n'
        "KeyboardInterrupt\n"
    )
    assert triage(BUSY + ctrl_c).kind == "busy"


# --- 2. the watchdog's outputs without its timeout line --------------------------------------


def test_a_schedulers_pyspy_dump_alone_means_the_watchdog_fired():
    report = triage(BUSY + PYSPY_PP0_BLOCKED)
    assert verdict(report)[:2] == ("hang", "C")


def test_the_older_cur_batch_debug_line_means_the_watchdog_fired():
    line = (
        "[2025-08-02 19:24:30 TP3] self.cur_batch.batch_size()=109, self.cur_batch.reqs=[Req("
        "rid=185ef8b8, input_ids=[128000, 128006])], self.token_to_kv_pool_allocator."
        "available_size()=2225\n"
    )
    report = triage(BUSY + line)
    assert verdict(report)[:2] == ("hang", "C")
    assert any("watchdog's own output" in e for e in report.evidence)


FAULTHANDLER_BY_WATCHDOG = """\
Thread 0x00007f3a2d7fe640 (most recent call first):
  File "/usr/lib/python3.12/threading.py", line 355 in wait
  File "/s/managers/cache_controller.py", line 801 in prefetch_thread_func
Current thread 0x00007f3a2effd640 (most recent call first):
  File "/s/managers/scheduler.py", line 2257 in watchdog_thread
  File "/usr/lib/python3.12/threading.py", line 1012 in run
Thread 0x00007f3b5d9a8740 (most recent call first):
  File "/s/distributed/parallel_state.py", line 1692 in recv_object
  File "/s/managers/scheduler_pp_mixin.py", line 170 in event_loop_pp
  File "/s/managers/scheduler.py", line 2710 in run_scheduler_process
  File "<string>", line 1 in <module>
"""


def test_a_faulthandler_dump_taken_from_the_watchdog_thread_is_a_hang():
    assert triage(BUSY + FAULTHANDLER_BY_WATCHDOG).kind == "hang"


def test_a_segfault_dump_with_an_idle_watchdog_thread_is_a_crash():
    idle = FAULTHANDLER_BY_WATCHDOG.replace("Current thread", "Thread").replace(
        "Thread 0x00007f3b5d9a8740", "Current thread 0x00007f3b5d9a8740", 1
    )
    report = triage("Fatal Python error: Segmentation fault\n\n" + idle)
    assert report.kind == "crash"


def test_a_components_dump_or_the_teardowns_dumps_are_not_the_watchdog():
    controller = PYSPY_PP0_BLOCKED.replace(
        "sglang::scheduler_PP0_TP0", "sglang::data_parallel_controller"
    ).replace(" PP0 TP0]", "]")
    assert triage(BUSY + controller).kind == "busy"
    after_quit = (
        "[2026-01-01 00:05:00] SIGQUIT received. signum=None, frame=None. It usually means one "
        "child failed.\n"
    )
    parsed = parse_log_lines((BUSY + after_quit + PYSPY_PP0_BLOCKED).splitlines(), "t")
    assert not parsed.debug_lines and parsed.dumps


# --- 3. NCCL's heartbeat monitor ------------------------------------------------------------

HEARTBEAT = (
    "[rank6]:[E429 13:55:49.384372190 ProcessGroupNCCL.cpp:1743] [PG ID 0 PG GUID 0(default_pg) "
    "Rank 6] ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress in "
    "monitoring enqueued collectives. This typically indicates a NCCL/CUDA API (e.g., "
    "CudaEventDestroy) hang blocking the watchdog.\n"
    "[rank6]:[F429 14:03:49.385461578 ProcessGroupNCCL.cpp:1554] [PG ID 0 PG GUID 0(default_pg) "
    "Rank 6] [PG ID 0 PG GUID 0(default_pg) Rank 6] Terminating the process after attempting "
    "to dump debug info, due to ProcessGroupNCCL watchdog hang.\n"
)


def test_the_nccl_heartbeat_monitor_is_a_hang_ended_by_nccl():
    assert verdict(triage(HEARTBEAT)) == ("hang", "C", None, 12)


def test_the_heartbeats_abort_after_it_is_not_a_crash_of_its_own():
    abort = (
        "terminate called after throwing an instance of 'c10::DistBackendError'\n"
        "  what():  [PG ID 0 PG GUID 0(default_pg) Rank 6] Process group watchdog thread "
        "terminated with exception\n"
        "Fatal Python error: Aborted\n"
    )
    assert verdict(triage(HEARTBEAT + abort))[:2] == ("hang", "C")


# --- 4. rank labels: every dimension, any order, damaged prefixes ---------------------------


def test_every_dimension_in_any_order():
    rank = parse_rank_tokens("TP3 EP3 ATTN_DP1 PP1 DP0 MOE_DP2 ATTN_CP0")
    assert (rank.pp, rank.tp, rank.dp, rank.attn_dp, rank.moe_dp, rank.attn_cp, rank.ep) == (
        1,
        3,
        0,
        1,
        2,
        0,
        3,
    )
    assert parse_rank_tokens("ATTN_DP2").dp is None  # never read as DP
    assert rank.label == "DP0 ATTN_DP1 PP1 ATTN_CP0 TP3"


CRASH_DP2 = (
    f"[2026-01-01 00:00:00 DP2 TP2 EP2] Scheduler hit an exception: {TB}\n"
    '  File "/s/scheduler.py", line 3, in run_batch\n'
    "RuntimeError: CUDA error: an illegal memory access was encountered\n"
)


def test_editor_line_numbers_before_the_prefix():
    numbered = "".join(f"{i + 1:>4}  {line}\n" for i, line in enumerate(CRASH_DP2.splitlines()))
    assert verdict(triage(numbered)) == ("crash", None, "DP2 PP0 TP2", 16)


def test_a_flattened_traceback_whose_prefix_lost_its_bracket():
    line = (
        "2026-01-01 00:00:00 PP1 TP0] Scheduler hit an exception: Traceback (most recent call "
        'last):   File "/s/hiradix_cache.py", line 3, in writing_check     '
        "self.ack_write_queue.pop(0) IndexError: pop from empty list"
    )
    assert verdict(triage(line)) == ("crash", "B", "PP1 TP0", 11)


def test_a_terminal_wrap_through_the_prefix():
    # Behind compose and kubectl prefixes SGLang's runs past column 80: the wrap cuts it.
    stamped = [
        f"sglang-decode-1  | 2026-01-01T00:00:00.{i:09d}Z " + line
        for i, line in enumerate(
            CRASH_DP2.replace("DP2 TP2 EP2", "DP2 PP1 ATTN_CP0 TP2 EP2").splitlines()
        )
    ]
    wrapped = []
    for line in stamped:
        while len(line) > 80:
            wrapped.append(line[:80])
            line = line[80:]
        wrapped.append(line)
    assert "]" not in wrapped[0].split("[2026", 1)[1]  # the prefix is cut in two
    assert verdict(triage("\n".join(wrapped))) == ("crash", None, "DP2 PP1 ATTN_CP0 TP2", 16)
    assert len(list(normalise(wrapped))) == len(stamped)


# --- 5. thin evidence, said honestly ---------------------------------------------------------


def test_access_lines_alone_are_a_healthy_server_with_low_confidence():
    text = "".join(
        f'[2026-01-01 00:00:0{i}] INFO:     10.0.0.7:4{i} - "POST /generate HTTP/1.1" 200 OK\n'
        for i in range(5)
    )
    report = triage(text)
    assert (report.kind, report.confidence, int(report.exit_code)) == ("healthy", "low", 0)
    assert any("--discover" in s for s in report.next_steps)


def test_one_ranks_dump_in_a_pp_send_is_a_likely_hang_and_asks_for_the_peer():
    dump = """\
Process 4101: sglang::scheduler_PP0_TP0
Python v3.12.3 (/usr/bin/python3.12)

Thread 4101 (idle): "MainThread"
    send_object (sglang/srt/distributed/parallel_state.py:1650)
    send_tensor_dict (sglang/srt/distributed/parallel_state.py:1800)
    _pp_send_dict_to_next_stage (sglang/srt/managers/scheduler_pp_mixin.py:950)
    event_loop_pp (sglang/srt/managers/scheduler_pp_mixin.py:170)
"""
    report = triage(dump)
    assert (report.kind, report.confidence) == ("hang", "low")
    assert any("PP1" in e for e in report.evidence)
    assert any("scheduler_PP1_TP0" in s for s in report.next_steps)


SHAPE = (
    f"[2026-01-01 00:00:00 TP0] Scheduler hit an exception: {TB}\n"
    '  File "/s/rotary_embedding.py", line 9, in forward_native\n'
    "    query = query.view(num_tokens, -1, self.head_size)\n"
    "RuntimeError: shape '[3013, -1, 128]' is invalid for input of size 8192000\n"
)


def test_a_shape_error_with_no_pp_in_sight_is_offered_as_form_a_if_pp():
    report = triage(SHAPE, num_heads=64)
    assert verdict(report)[:2] == ("crash", None) and report.confidence == "medium"
    offer = next(e for e in report.evidence if "if this deployment runs pipeline" in e)
    assert "1000 upstream tokens x 64 heads" in offer


def test_the_pp_size_hint_makes_it_form_a():
    assert verdict(triage(SHAPE, pp_size=2))[:2] == ("crash", "A")
    assert verdict(triage(SHAPE, pp_size=1))[:2] == ("crash", None)


def test_stacks_dumped_during_the_teardown_are_not_a_hang():
    # 0.5.23's launcher dumps its children after the SIGQUIT: PP1 then waits on a PP0 that is
    # already gone. That picture is the teardown's, not the reason the server was stopped.
    after = TEARDOWN + PYSPY_PP0_BLOCKED.replace("00:05:00", "00:10:07")
    report = triage(BUSY + after)
    assert report.kind == "busy"
    assert any("taken after the stop" in e for e in report.evidence)
