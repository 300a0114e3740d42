"""Inputs as they really come, and the meaning rules (issue 12): each case is a real-format text."""

from __future__ import annotations

from hicache_diag.evidence.stacks import parse_pyspy_text
from hicache_diag.logs.parse import parse_log_lines
from hicache_diag.triage.classify import classify
from hicache_diag.triage.hang import RankSamples

PYSPY_GIL = """Process 7300: sglang::scheduler_PP0_TP0
Python v3.12.3 (/usr/bin/python3.12)

Thread 7300 (active+gil): "MainThread"
    forward_cuda (sglang/srt/layers/rotary_embedding/base.py:455)
Thread 7311 (idle): "Thread-5 (prefetch_io_aux_func)"
    wait (threading.py:359)
    get (queue.py:180)
    prefetch_io_aux_func (sglang/srt/managers/cache_controller.py:1250)
"""


TB = "Traceback (most recent call last):"


def classify_log(text: str):
    return classify([], parse_log_lines(text.splitlines(), "t.log"))


def test_active_gil_thread_header_parses_and_is_the_main_thread():
    [dump] = parse_pyspy_text(PYSPY_GIL.splitlines(), "d")
    main = dump.main_thread()
    assert main.name == "MainThread" and main.active and main.frames[0].name == "forward_cuda"


def test_collector_prefixes_partial_lines_and_glued_prefixes():
    text = (
        "2026-06-24T17:38:03.1Z stderr P [2026-06-24 15:38:03 PP1 TP0] Scheduler hit an exce\n"
        "2026-06-24T17:38:03.2Z stderr F ption: Traceback (most recent call last):\n"
        '2026-06-24T17:38:03.3Z stderr F   File "/s/scheduler_pp_mixin.py", line 9, in '
        "event_loop_pp\n"
        "2026-06-24T17:38:03.4Z stderr F RuntimeError: shape '[65, -1, 64]' is invalid for input "
        "of size 827392\n"
    )
    report = classify_log(text)
    assert (report.kind, report.form, report.culprit.rank.label) == ("crash", "A", "PP1 TP0")
    loki = "1719857000123456789\t[2026-06-24 15:38:03 PP0 TP0] Prefill batch, #new-seq: 1\n"
    table = (
        "| 2026-06-24 15:38:03.1 | [2026-06-24 15:38:03 PP1 TP0] Decode batch, #running-req: 1 |\n"
    )
    glued = "loading 50%[2026-06-24 15:38:04 PP0 TP0] Decode batch, #running-req: 2\n"
    ev = parse_log_lines((loki + table + glued).splitlines(), "t.log")
    assert len(ev.progress_lines) == 3 and ev.context.pp


def test_flattened_traceback_on_one_line():
    line = (
        "[2026-01-01 00:00:00 PP1 TP0] Scheduler hit an exception: Traceback (most recent call "
        'last):   File "/s/hiradix_cache.py", line 3, in writing_check     '
        "self.ack_write_queue.pop(0) IndexError: pop from empty list"
    )
    report = classify_log(line)
    assert (report.kind, report.form, report.culprit.rank.label) == ("crash", "B", "PP1 TP0")


def test_generic_pop_from_empty_list_elsewhere_is_another_crash():
    text = (
        "[2026-01-01 00:00:00 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "/s/collate.py", line 3, in collate\n'
        "IndexError: pop from empty list\n"
    )
    report = classify_log(text)
    assert (report.kind, report.form, int(report.exit_code)) == ("crash", None, 16)
    assert not any("bisect" in s for s in report.next_steps)  # no HiCache advice here


def test_dead_thread_with_a_watchdog_is_a_hang_caused_by_the_thread():
    text = (
        "[2026-01-01 00:00:00 PP1 TP0] Exception in thread Thread-5 (prefetch_io_aux_func):\n"
        "Traceback (most recent call last):\n"
        '  File "/s/cache_controller.py", line 1250, in prefetch_io_aux_func\n'
        "OSError: Short read for abc.bin\n"
        "[2026-01-01 00:05:00 PP0 TP0] Scheduler watchdog timeout "
        "(self.watchdog_timeout=300, self.soft=False)\n"
    )
    report = classify_log(text)
    assert (report.kind, report.form, report.culprit.rank.label) == ("hang", "C", "PP1 TP0")
    assert "OSError" in report.signature
    assert any("not necessarily the culprit" in e for e in report.evidence)


def test_soft_watchdog_is_not_a_hang():
    text = (
        "[2026-01-01 00:00:00 TP0] Scheduler debug info:\n"
        "[2026-01-01 00:00:00 TP0] Scheduler watchdog timeout "
        "(self.watchdog_timeout=30, self.soft=True)\n"
        "[2026-01-01 00:00:01] TokenizerManager watchdog timeout "
        "(self.watchdog_timeout=30, self.soft=True)\n"
    )
    report = classify_log(text)
    assert report.kind == "unknown" and int(report.exit_code) == 3


def test_pyspy_that_cannot_suspend_names_the_stopped_rank():
    text = (
        "[2026-01-01 00:05:00 PP0 TP0] Scheduler watchdog timeout "
        "(self.watchdog_timeout=300, self.soft=False)\n"
        "[2026-01-01 00:05:00 PP1 TP0] Pyspy failed (py-spy dump --native --pid 4242). Error: "
        "Error: Failed to suspend process\n"
        "[2026-01-01 00:05:00 PP1 TP0] All pyspy dump attempts failed for PID 4242.\n"
    )
    report = classify_log(text)
    assert (report.kind, report.cause, report.culprit.rank.label) == (
        "hang",
        "straggler",
        "PP1 TP0",
    )


def test_silent_rank_among_complaining_peers_is_the_culprit():
    text = (
        "[2026-01-01 00:00:00 PP0 TP0] Decode batch, #running-req: 1\n"
        "[2026-01-01 00:00:00 PP1 TP0] Decode batch, #running-req: 1\n"
        "[2026-01-01 00:00:00 PP2 TP0] Decode batch, #running-req: 1\n"
        f"[2026-01-01 00:00:09 PP0 TP0] Scheduler hit an exception: {TB}\n"
        '  File "/s/parallel_state.py", line 1, in recv_object\n'
        "RuntimeError: [pair.cc:589] Read error [1.2.3.4]:1: Connection reset by peer\n"
        f"[2026-01-01 00:00:09 PP2 TP0] Scheduler hit an exception: {TB}\n"
        '  File "/s/parallel_state.py", line 1, in recv_object\n'
        "RuntimeError: [pair.cc:547] Connection closed by peer [1.2.3.4]:2\n"
    )
    report = classify_log(text)
    assert (report.kind, report.culprit.rank.label, int(report.exit_code)) == (
        "crash",
        "PP1 TP0",
        16,
    )
    assert report.signature.startswith("PP1 TP0 went silent")


def test_dump_without_a_title_is_rank_unknown_and_one_rank_is_not_network_suspect():
    text = (
        'Thread 88693 (idle): "MainThread"\n'
        "    recv (torch/distributed/distributed_c10d.py:2577)\n"
        "    recv_object (sglang/srt/distributed/parallel_state.py:1692)\n"
    )
    ev = parse_log_lines(
        ["Process 88693: python3 -m sglang.launch_server", *text.splitlines()], "t"
    )
    report = classify([], ev)
    assert report.kind == "unknown" and "insufficient evidence" in (report.reason or "")
    assert [r.rank.label for r in report.ranks] == ["rank ?"]


def test_post_mortem_dump_is_never_busy():
    dump = parse_pyspy_text(
        [
            "Process 1: sglang::scheduler_PP0_TP0",
            'Thread 1 (active): "MainThread"',
            "    _shutdown (threading.py:1583)",
        ],
        "d",
    )[0]
    report = classify([RankSamples(dump.rank, 1, dump.title, [dump])])
    assert report.kind != "busy" and report.ranks[0].state == "exited"


def test_faulthandler_block_inside_a_log_is_a_crash():
    text = (
        "[2026-01-01 00:00:00 TP0] Prefill batch, #new-seq: 1\n"
        "Fatal Python error: Segmentation fault\n\n"
        "Current thread 0x00007fe00332e1c0 (most recent call first):\n"
        '  File "/s/scheduler.py", line 9 in event_loop_normal\n'
    )
    report = classify_log(text)
    assert (report.kind, report.form, int(report.exit_code)) == ("crash", None, 16)


def test_benign_noise_is_not_a_crash():
    text = (
        "[2026-01-01 00:00:00 TP0] Ignore import error when loading sglang.srt.models.x: "
        "No module named 'y'\n"
        "nanobind: leaked 2 instances!\n"
        "[2026-01-01 00:00:01] The server is fired up and ready to roll!\n"
    )
    assert classify_log(text).kind == "healthy"


def test_an_error_the_server_survived_is_not_the_crash():
    """The HTTP / launcher process logs a handled traceback, then the schedulers keep serving."""
    text = (
        "[2026-01-01 00:00:00] Request failed\n"
        f"{TB}\n"
        '  File "/s/http_server.py", line 9, in handler\n'
        "ValueError: bad request\n"
        "[2026-01-01 00:00:01 PP0] Prefill batch, #new-seq: 1, #new-token: 8\n"
        "[2026-01-01 00:00:01 PP1] Prefill batch, #new-seq: 1, #new-token: 8\n"
    )
    assert classify_log(text).kind == "busy"
    # the same traceback logged as a scheduler's death is a crash, progress or not
    dead = text.replace("Request failed", "Scheduler hit an exception:")
    dead = dead.replace(f"exception:\n{TB}", f"exception: {TB}")
    assert classify_log(dead).kind == "crash"
