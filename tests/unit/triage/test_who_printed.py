"""Issue 38 part 4: who printed it, continued. A client library's traceback is the client's
wherever it is pasted; a fatal line that names no rank names none; an engine's stats line is
progress, busy or idle by its numbers; Flight Recorder's and NCCL's own lines are timeouts."""

from __future__ import annotations

from hicache_diag.logs.parse import parse_log_lines
from hicache_diag.rules.engine_stats import engine_stats, idle_line
from hicache_diag.triage.classify import classify


def verdict(lines: list[str]):
    report = classify([], parse_log_lines(lines, "x.log"))
    return report.kind, report.form, report.culprit.rank.label if report.culprit else None


CLIENT = [
    "sglang/lang/interpreter.py:328: UserWarning: Error in stream_executor: Traceback (most "
    "recent call last):",
    'File "/home/u/sglang/python/sglang/lang/interpreter.py", line 326, in _thread_worker_func',
    "self._execute(expr)",
    'File "/home/u/sglang/python/sglang/utils.py", line 116, in encode_image_base64',
    'image.save(buffered, format="PNG")',
    "AttributeError: 'tuple' object has no attribute 'save'",
]


def test_a_client_librarys_traceback_is_the_clients_even_unindented():
    report = classify([], parse_log_lines(CLIENT, "x.log"))
    assert report.kind == "unknown" and report.emitter == "client"
    served = ["[2026-06-24 15:00:00 TP0] Decode batch, #running-req: 2", *CLIENT]
    assert verdict(served)[0] == "busy"  # a client's error beside a server's progress


def test_a_fatal_line_with_no_label_names_no_rank():
    lines = [
        "[2026-06-24 15:00:00 PP1 TP0] Decode batch, #running-req: 2",
        "Fatal Python error: Segmentation fault",
        "",
        "Thread 0x00007f3a2c1ff640 (most recent call first):",
        '  File "/sgl/scheduler.py", line 1 in event_loop_normal',
    ]
    assert verdict(lines) == ("crash", None, None)


def test_vllms_worker_death_names_the_worker():
    line = "ERROR 11-08 11:01:29 [multiproc_executor.py:135] Worker proc VllmWorker-3 died "
    assert verdict([line + "unexpectedly, shutting down executor."]) == ("crash", None, "PP0 TP3")


def test_stats_lines_are_busy_or_idle_by_their_numbers():
    busy = (
        "INFO 04-28 22:54:32 [loggers.py:257] Engine 000: Avg prompt throughput: 0.0 tokens/s, "
        "Avg generation throughput: 5.4 tokens/s, Running: 1 reqs, Waiting: 14 reqs"
    )
    idle = busy.replace("5.4", "0.0").replace("Running: 1", "Running: 0")
    idle = idle.replace("Waiting: 14", "Waiting: 0")
    assert engine_stats(busy).queued == 14 and not idle_line(busy) and idle_line(idle)
    assert verdict([busy] * 3)[0] == "busy"
    assert verdict([busy, idle])[0] == "healthy"
    old = "INFO 02-01 06:36:05 llm_engine.py:921] Avg prompt throughput: 382.6 tokens/s, "
    old += "Avg generation throughput: 118.5 tokens/s, Running: 35 reqs, Pending: 115 reqs"
    assert verdict([old, '"POST /v1/completions HTTP/1.1" 200 OK'])[0] == "busy"


def test_flight_recorders_lines_and_ncclcheck_timeout_frames_are_a_timeout():
    fr = (
        "[rank0]:[E804 23:05:54.817424543 ProcessGroupNCCL.cpp:1914] [PG ID 0 PG GUID 0"
        "(default_pg) Rank 0] Received a dump signal due to a collective timeout from  rank 13"
        " and we will try our best to dump the debug info."
    )
    observed = (
        "[rank0]:[E804 23:05:54.8 ProcessGroupNCCL.cpp:1849] [PG ID 0 PG GUID 0(default_pg) "
        "Rank 0] Observed flight recorder dump signal from another rank via TCPStore."
    )
    frames = "Exception raised from checkTimeout at ../torch/csrc/distributed/c10d/PG.cpp:609"
    for line in (fr, observed, frames):
        assert verdict([line])[:2] == ("hang", "C"), line


def test_a_headless_traceback_ending_the_text_is_a_crash_cut_short():
    body = [
        '  File "/vllm/v1/worker/gpu_worker.py", line 1015, in sample_tokens',
        "    return self.model_runner.sample_tokens(grammar_output)",
    ]
    assert verdict(body)[0] == "crash"
    printed = [*body, "[2026-06-24 15:00:00 TP0] Decode batch, #running-req: 2"]
    assert verdict(printed)[0] == "busy"  # a printed stack that runs into a record: no error
