"""SGLang log parsing: prefixes, tracebacks, py-spy blocks, watchdog and cascade lines."""

from __future__ import annotations

from hicache_diag.evidence.ranks import RankId
from hicache_diag.logs.parse import parse_log_lines

LOG = """[2026-05-26 15:19:17 PP0 ATTN_CP0 TP0] Prefill batch, #new-seq: 1, #new-token: 64,
[2026-05-26 15:19:18 PP2 ATTN_CP2 TP2] Scheduler hit an exception: Traceback (most recent call last):
  File "/s/parallel_state.py", line 1692, in recv_object
    work.wait()
RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:547] Connection closed by peer [1.2.3.4]:17092
[2026-05-26 15:19:18 PP1 TP0] Pyspy dump for PID 321:
Thread 321 (idle): "MainThread"
    recv (torch/distributed/distributed_c10d.py:2577)
    _pp_sync (sglang/srt/mem_cache/hiradix_cache.py:269)

[2026-05-26 15:19:19 PP1 TP0] Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=False)
Exception in thread Thread-5 (prefetch_io_aux_func):
Traceback (most recent call last):
  File "/s/cache_controller.py", line 900, in prefetch_io_aux_func
    self._page_transfer(op)
OSError: Short read for abc.bin
"""  # noqa: E501


def test_prefix_traceback_and_cascade():
    ev = parse_log_lines(LOG.splitlines(), "s.log")
    first = ev.exceptions[0]
    assert first.rank == RankId(pp=2, tp=2, attn_cp=2)
    assert first.ts == "2026-05-26 15:19:18"
    assert first.exc_type == "RuntimeError" and first.is_cascade
    assert first.frames == ["recv_object"]
    assert len(ev.progress_lines) == 1


def test_pyspy_block_takes_rank_from_the_log_prefix():
    ev = parse_log_lines(LOG.splitlines(), "s.log")
    [dump] = ev.dumps
    assert dump.pid == 321 and dump.rank == RankId(pp=1, tp=0)
    assert [f.name for f in dump.main_thread().frames] == ["recv", "_pp_sync"]


def test_watchdog_and_thread_death():
    ev = parse_log_lines(LOG.splitlines(), "s.log")
    assert ev.hang_lines[0].rank == RankId(pp=1, tp=0)
    death = ev.exceptions[1]
    assert death.thread == "Thread-5 (prefetch_io_aux_func)"
    assert death.exc_type == "OSError" and not death.is_cascade


def test_unrecognised_text_counts_nothing():
    ev = parse_log_lines(["hello", "nothing here", "Traceback is a word"], "x")
    assert ev.recognised == 0 and not ev.exceptions


def test_truncated_traceback_still_reported():
    ev = parse_log_lines(
        ["[PP0 TP0] boom Traceback (most recent call last):", '  File "a", line 1, in f'], "x"
    )
    assert ev.exceptions[0].message == "traceback cut short"


def test_cpp_terminate_with_what_line():
    lines = [
        "[2026-11-29 18:26:14 PP0 TP0] rank 0 up",
        "terminate called after throwing an instance of 'gloo::EnforceNotMet'",
        "  what():  [enforce fail at pair.cc:456] Received data size doesn't match expected size.",
    ]
    ev = parse_log_lines(lines, "x")
    [exc] = ev.exceptions
    # The abort carries no label of its own: the line before it does not make it PP0 TP0's
    # (a culprit comes from evidence, never from adjacency).
    assert exc.rank is None and exc.exc_type == "EnforceNotMet"
    assert "doesn't match expected size" in exc.message and not exc.is_cascade


def test_collector_prefixes_are_stripped():
    journald = "Jul 01 18:00:57 gpu-node-3 python3[4242]: "
    kubectl = "2026-07-01T18:00:57.123456789Z "
    for carrier in (journald, kubectl):
        lines = [
            carrier + "[2026-07-01 18:00:57 PP1 TP0] Scheduler hit an exception: Traceback (most"
            " recent call last):",
            carrier + '  File "/s/hiradix_cache.py", line 618, in writing_check',
            carrier + "    ack = self.cache_controller.ack_write_queue.pop(0)",
            carrier + "IndexError: pop from empty list",
        ]
        [exc] = parse_log_lines(lines, "x").exceptions
        assert exc.rank == RankId(pp=1, tp=0) and exc.frames == ["writing_check"]
        assert exc.text == "IndexError: pop from empty list"
